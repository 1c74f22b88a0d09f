"""Rules every door applies: bounds, keys, secrets, exposure, settings checks, domain errors.

Owns: `limits` (input bounds, one rule each, invariant 13), `masking` (what operators see of
secrets, Airflow's secrets masker), `encryption` (Fernet for Connection secrets), `keys` (keys the
service makes for itself under `var/keys/`), `exposure` (loopback or exposed; the first admin),
`checks` (the system checks of every setting rule), `run_ids` (run ids as Airflow allows them) and
`exceptions` (the domain exceptions: a machine `reason` and a human `message`).

Writes: no table (`keys` writes its files under KEY_DIR, `exposure.ensure_superuser` the first admin
user).

May import: the shared packages only.
"""
