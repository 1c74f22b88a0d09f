"""The asset event service: one package per capability (README, "Where the code lives")."""
