"""Task specs and task pools."""

from envsched.pool.pool import TaskPool
from envsched.pool.spec import TaskSpecError, task_key, validate_task_spec

__all__ = ["TaskPool", "TaskSpecError", "task_key", "validate_task_spec"]
