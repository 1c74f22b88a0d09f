"""Django format modules (`FORMAT_MODULE_PATH`): how the admin shows dates and times.

Owns: `en.formats`. Writes: no table. May import: nothing of the service.
"""
