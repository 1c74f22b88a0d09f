"""`/auth/`: login with a password, Airflow 3.3.2's auth manager routes (issue 49); the token is
made and checked by `operations.logins`.

- `POST /auth/token`: a JSON or form body `{"username", "password"}` (any other Content-Type:
  415); `POST /auth/token/cli`: JSON only, the token valid JWT_CLI_EXPIRATION_TIME instead of
  JWT_EXPIRATION_TIME (what `airflowctl auth login` posts). 201 `{"access_token": <JWT>}`.
- Airflow's refusals, word for word: an empty username or password 400 "Username and password
  must be provided"; no such active user or a wrong password 401 "Invalid credentials"; a body
  that is not `LoginBody` (a field missing, one more, not JSON) 422 with FastAPI's list of
  `{type, loc, msg}`; `GET /auth/token` and `/auth/token/login` 403, as Airflow answers them
  unless every user is an admin.
- Ours: 429 (with `Retry-After`) while too many recent failures name the username or come from
  the client address (`logins.log_in`), where Airflow's simple manager has no limit.

- `GET /api/v2/auth/logout` (Airflow's core API route): revokes the login token of the
  `Authorization: Bearer` header and of a `_token` cookie (`logins.log_out`), then 307 to the
  login page; `GET /api/v2/auth/login`: 307 to the login page (the admin's), with a `next` only
  when it is safe (400 "Invalid or unsafe next URL" otherwise).

These are plain Django views, not a ninja API: the bodies are Airflow's (`{"detail": "..."}` with
a string), no session or CSRF is involved, and the form body is parsed as Airflow does.
"""

import json
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.csrf import csrf_exempt
from pydantic import BaseModel, ConfigDict, ValidationError

from assets_app.operations import logins

JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
ALL_ADMINS_ONLY = "This method is only allowed if ``[core] simple_auth_manager_all_admins`` is True"


class LoginBody(BaseModel):
    """Airflow's `LoginBody` (a StrictBaseModel: no other field)."""

    model_config = ConfigDict(extra="forbid")

    username: str
    password: str


def _detail(status: int, detail: Any) -> JsonResponse:
    return JsonResponse({"detail": detail}, status=status)


def _invalid(errors: list[dict[str, Any]]) -> JsonResponse:
    return _detail(422, errors)


def _client(request: HttpRequest) -> str:
    return request.META.get("REMOTE_ADDR") or "unknown"


def _body(request: HttpRequest, *, form_allowed: bool) -> dict[str, Any] | JsonResponse:
    content_type = request.content_type or JSON
    if form_allowed and content_type.startswith(FORM):
        return {"username": request.POST.get("username"), "password": request.POST.get("password")}
    if form_allowed and not content_type.startswith(JSON):
        return _detail(
            415, "Only application/json or application/x-www-form-urlencoded is supported"
        )
    try:
        body = json.loads(request.body or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        return _invalid(
            [
                {
                    "type": "json_invalid",
                    "loc": ["body", 0],
                    "msg": "JSON decode error",
                    "ctx": {"error": str(exc)},
                }
            ]
        )
    if not isinstance(body, dict):
        return _invalid(
            [
                {
                    "type": "model_attributes_type",
                    "loc": ["body"],
                    "msg": "Input should be a valid dictionary or object to extract fields from",
                }
            ]
        )
    return body


def _login(request: HttpRequest, *, form_allowed: bool, lifetime_seconds: int) -> HttpResponse:
    body = _body(request, form_allowed=form_allowed)
    if isinstance(body, JsonResponse):
        return body
    try:
        login = LoginBody.model_validate(body)
    except ValidationError as exc:
        return _invalid(
            [
                {"type": e["type"], "loc": ["body", *e["loc"]], "msg": e["msg"]}
                for e in exc.errors(include_url=False)
            ]
        )
    if not login.username or not login.password:
        return _detail(400, "Username and password must be provided")
    try:
        token = logins.log_in(
            request=request,
            username=login.username,
            password=login.password,
            client=_client(request),
            lifetime_seconds=lifetime_seconds,
        )
    except logins.InvalidCredentials:
        return _detail(401, "Invalid credentials")
    except logins.LoginThrottled as exc:
        response = _detail(
            429,
            f"Too many failed login attempts; try again in {exc.retry_after_seconds} seconds",
        )
        response["Retry-After"] = str(exc.retry_after_seconds)
        return response
    return JsonResponse({"access_token": token}, status=201)


@csrf_exempt
def token(request: HttpRequest) -> HttpResponse:
    """`/auth/token`: POST logs in (JSON or form); GET is Airflow's all-admins door, closed."""
    if request.method == "GET":
        return _detail(403, ALL_ADMINS_ONLY)
    if request.method != "POST":
        return _method_not_allowed(("GET", "POST"))
    return _login(request, form_allowed=True, lifetime_seconds=settings.JWT_EXPIRATION_TIME)


@csrf_exempt
def token_cli(request: HttpRequest) -> HttpResponse:
    """`/auth/token/cli`: POST logs in (JSON), a token of JWT_CLI_EXPIRATION_TIME."""
    if request.method != "POST":
        return _method_not_allowed(("POST",))
    return _login(request, form_allowed=False, lifetime_seconds=settings.JWT_CLI_EXPIRATION_TIME)


@csrf_exempt
def token_login(request: HttpRequest) -> HttpResponse:
    """`GET /auth/token/login`: Airflow's all-admins redirect, closed here as it is there."""
    if request.method != "GET":
        return _method_not_allowed(("GET",))
    return _detail(403, ALL_ADMINS_ONLY)


def _method_not_allowed(allowed: tuple[str, ...]) -> HttpResponse:
    response = _detail(405, "Method Not Allowed")
    response["Allow"] = ", ".join(allowed)
    return response


# Airflow's UI keeps its login token in this cookie (`COOKIE_NAME_JWT_TOKEN`); logout ends it too.
TOKEN_COOKIE = "_token"


def _redirect(url: str) -> HttpResponse:
    response = HttpResponse(status=307)
    response["Location"] = url
    return response


@csrf_exempt
def logout(request: HttpRequest) -> HttpResponse:
    """`GET /api/v2/auth/logout`: revoke the request's login tokens, 307 to the login page
    (Airflow: `auth_manager.get_url_login()`, the cookie deleted). Credentials are optional, as
    in Airflow: a request without a valid login token is simply redirected."""
    if request.method != "GET":
        return _method_not_allowed(("GET",))
    scheme, _, bearer = request.headers.get("Authorization", "").partition(" ")
    tokens = [bearer] if scheme.lower() == "bearer" and bearer else []
    if request.COOKIES.get(TOKEN_COOKIE):
        tokens.append(request.COOKIES[TOKEN_COOKIE])
    logins.log_out(tokens=tokens, client=_client(request))
    response = _redirect(reverse("admin:login"))
    response.delete_cookie(TOKEN_COOKIE, path="/")
    return response


@csrf_exempt
def login_page(request: HttpRequest) -> HttpResponse:
    """`GET /api/v2/auth/login`: 307 to the login page, with `next` when it is safe."""
    if request.method != "GET":
        return _method_not_allowed(("GET",))
    url = reverse("admin:login")
    next_url = request.GET.get("next")
    if next_url:
        if not url_has_allowed_host_and_scheme(
            next_url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        ):
            return _detail(400, "Invalid or unsafe next URL")
        url += "?" + urlencode({"next": next_url})
    return _redirect(url)
