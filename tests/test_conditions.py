"""The schedule condition language: parsing (errors name the JSON path), normal form, references,
evaluation."""

import pytest

from assets_app.definitions import conditions
from assets_app.definitions.conditions import AliasRef, AllOf, AnyOf, AssetRef, ConditionError

NESTED = {"all": ["a", {"any": [{"name": "b", "uri": "s3://b"}, {"alias": "x"}]}]}


def test_parse_nested_condition():
    assert conditions.parse(NESTED) == AllOf(
        (AssetRef("a", "a"), AnyOf((AssetRef("b", "s3://b"), AliasRef("x"))))
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("orders", AssetRef("orders", "orders")),
        ({"name": "orders"}, AssetRef("orders", "orders")),
        ({"uri": "s3://o"}, AssetRef("s3://o", "s3://o")),
        ({"name": "o", "uri": "s3://o"}, AssetRef("o", "s3://o")),
        ({"asset": {"name": "o", "uri": "s3://o"}}, AssetRef("o", "s3://o")),
        ({"asset": "o"}, AssetRef("o", "o")),
        ({"alias": "x"}, AliasRef("x")),
    ],
)
def test_parse_references(raw, expected):
    assert conditions.parse(raw) == expected


def test_normal_form_round_trips():
    parsed = conditions.parse(NESTED)
    stored = conditions.to_json(parsed)
    assert stored == {
        "all": [
            {"asset": {"name": "a", "uri": "a"}},
            {"any": [{"asset": {"name": "b", "uri": "s3://b"}}, {"alias": "x"}]},
        ]
    }
    assert conditions.parse(stored) == parsed
    assert conditions.to_json(conditions.parse(stored)) == stored


@pytest.mark.parametrize(
    ("raw", "path", "message"),
    [
        (5, "schedule", "condition must be a string or an object, got an integer"),
        ([], "schedule", "condition must be a string or an object, got a list"),
        ({}, "schedule", "condition must not be empty"),
        ("", "schedule", "must not be empty"),
        ("   ", "schedule", "must not be empty"),
        ({"every": ["a"]}, "schedule.every", "unknown condition operator 'every'"),
        ({"all": ["a", {"nope": 1}]}, "schedule.all[1].nope", "unknown condition operator 'nope'"),
        ({"all": "a"}, "schedule.all", "must be a list, got a string"),
        ({"any": []}, "schedule.any", "must not be empty"),
        (
            {"all": ["a"], "any": ["b"]},
            "schedule.any",
            "'all' must be the only key of its condition, got 'any'",
        ),
        (
            {"alias": "x", "name": "y"},
            "schedule.name",
            "'alias' must be the only key of its condition, got 'name'",
        ),
        ({"alias": 3}, "schedule.alias", "must be a string, got an integer"),
        ({"all": [{"any": [{"name": 1}]}]}, "schedule.all[0].any[0].name", "must be a string"),
        ({"asset": {"name": "a", "url": "u"}}, "schedule.asset.url", "unknown key"),
        ({"asset": 7}, "schedule.asset", "asset reference must be a string or an object"),
        ("a" * 1501, "schedule", "longer than 1500 characters"),
        ({"name": "a", "uri": None}, "schedule.uri", "must be a string, got null"),
    ],
)
def test_parse_errors_name_the_path(raw, path, message):
    with pytest.raises(ConditionError) as info:
        conditions.parse(raw)
    assert info.value.path == path
    assert message in info.value.message
    assert str(info.value).startswith(f"{path}: ")


def test_parse_error_path_prefix_is_the_callers():
    with pytest.raises(ConditionError) as info:
        conditions.parse({"any": [{"bad": 1}]}, path="[2].schedule")
    assert info.value.path == "[2].schedule.any[0].bad"


def test_referenced_assets_and_aliases_in_first_occurrence_order_without_duplicates():
    parsed = conditions.parse(
        {"any": [{"all": ["b", "a", {"alias": "y"}]}, {"all": ["a", {"alias": "x"}, "c"]}, "b"]}
    )
    assert [ref.name for ref in conditions.referenced_assets(parsed)] == ["b", "a", "c"]
    assert conditions.referenced_aliases(parsed) == ["y", "x"]


def test_referenced_of_single_refs():
    assert conditions.referenced_assets(conditions.parse("a")) == [AssetRef("a", "a")]
    assert conditions.referenced_aliases(conditions.parse("a")) == []
    assert conditions.referenced_aliases(conditions.parse({"alias": "x"})) == ["x"]


@pytest.mark.parametrize(
    ("present", "expected"),
    [
        (set(), False),
        ({"a"}, False),
        ({"b"}, False),
        ({"a", "b"}, True),
        ({"a", "c"}, True),  # c is linked to the alias x
        ({"a", "d"}, False),
        ({"c", "b"}, False),
    ],
)
def test_evaluate_all_any_nested_alias(present, expected):
    parsed = conditions.parse({"all": ["a", {"any": ["b", {"alias": "x"}]}]})
    assert conditions.evaluate(parsed, present=present, alias_assets={"x": {"c"}}) is expected


def test_evaluate_single_asset_and_any():
    assert conditions.evaluate(conditions.parse("a"), present={"a"}) is True
    assert conditions.evaluate(conditions.parse("a"), present={"b"}) is False
    any_of = conditions.parse({"any": ["a", "b"]})
    assert conditions.evaluate(any_of, present={"b"}) is True
    assert conditions.evaluate(any_of, present={"c"}) is False


def test_evaluate_matches_assets_by_name():
    parsed = conditions.parse({"name": "orders", "uri": "s3://b/orders"})
    assert conditions.evaluate(parsed, present={"orders"}) is True
    assert conditions.evaluate(parsed, present={"s3://b/orders"}) is False


def test_alias_without_links_is_not_met():
    parsed = conditions.parse({"alias": "x"})
    assert conditions.evaluate(parsed, present={"a"}) is False
    assert conditions.evaluate(parsed, present={"a"}, alias_assets={"x": set()}) is False
    assert conditions.evaluate(parsed, present={"a"}, alias_assets={"x": {"a", "z"}}) is True
