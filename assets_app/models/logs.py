"""Task logs shipped by workers (issue 27): one row per chunk of one try's log file."""

from django.db import models
from django.utils import timezone

from .runs import TaskInstance


class TaskLogChunk(models.Model):
    """`content` is the text of bytes [offset, offset + size) of the log of try `try_number` of
    `ti` (the worker's file, Airflow's JSON lines). Retention deletes a run's chunks with its task
    instances (`operations.retention`, by `ti_id`), never by age alone; the database deletes
    them with their TI too (CASCADE)."""

    ti = models.ForeignKey(TaskInstance, on_delete=models.CASCADE, related_name="log_chunks")
    try_number = models.PositiveIntegerField()
    offset = models.BigIntegerField()
    size = models.PositiveIntegerField()  # bytes of the file this chunk covers
    content = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["ti_id", "try_number", "offset"]
        constraints = [
            models.UniqueConstraint(
                fields=["ti", "try_number", "offset"], name="task_log_chunk_unique"
            ),
            models.CheckConstraint(
                condition=models.Q(offset__gte=0), name="task_log_chunk_offset_nonnegative"
            ),
        ]
        indexes = [models.Index(fields=["created_at"], name="task_log_chunk_created")]

    def __str__(self) -> str:
        return f"log of {self.ti_id} try {self.try_number} at {self.offset}"
