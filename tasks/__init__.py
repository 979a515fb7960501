"""ptxbench's tasks: definitions (FlashInfer-Bench Definition shape + extensions), input
generators, fp32 references, library baselines and what a model is told about a task.

Imports only pydantic here; torch is imported by generators/reference/baselines when used.
"""
from tasks.registry import ALIASES, TASKS, UnknownTask, aliases_of, get_task, list_tasks, load_definition, \
    missing_workloads_reason, select_many, select_tasks, task_split
from tasks.schema import Task, Workload

__all__ = ["ALIASES", "TASKS", "Task", "UnknownTask", "Workload", "aliases_of", "get_task", "list_tasks",
           "load_definition", "missing_workloads_reason", "select_many", "select_tasks", "task_split"]
