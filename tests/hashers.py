"""The suite's password hasher: Django's PBKDF2-SHA256 with 1,000 iterations instead of its
1,000,000 (about 0.4 s a hash on this machine, paid by every test that makes a user or logs
one in). Its hashes are ordinary `pbkdf2_sha256$1000$...` strings, which carry their iteration
count, so a live server the suite starts (gunicorn, `bin/serve`, with the project's own hashers)
checks them as it checks any other. Used by the in-process tests only (tests/conftest.py)."""

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class FastPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1000
