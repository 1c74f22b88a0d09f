"""Date formats for the operator admin: sortable, second-precision, no locale prose
("2026-11-30 08:25:55" rather than "Nov. 30, 2026, 8:25 a.m."). Times are UTC (TIME_ZONE)."""

DATETIME_FORMAT = "Y-m-d H:i:s"
SHORT_DATETIME_FORMAT = "Y-m-d H:i"
DATE_FORMAT = "Y-m-d"
