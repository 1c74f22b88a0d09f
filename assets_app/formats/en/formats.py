"""Date formats for the operator admin: sortable, second-precision, no locale prose
("2026-11-30 08:25:55 UTC" rather than "Nov. 30, 2026, 8:25 a.m."), with the zone they are
shown in: TIME_ZONE, or the operator's own choice
(assets_app.api.service_middleware.OperatorTimezone)."""

DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i T"
DATE_FORMAT = "Y-m-d"
