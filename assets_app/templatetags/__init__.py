"""Template filters and tags of the operator admin pages (`aes_admin`).

Owns: presentation only. Writes: no table. May import: the admin and the
shared packages (a door, with the admin).
"""
