"""The task families' code: each module defines its family's tasks (shapes, workloads, the
reference, tolerances, requested features) and tasks/families/baselines.py the libraries they
are timed against. The task data (definitions, simple and expert solutions) lives beside this
package in tasks/<task>/; tasks/registry.py lists the families' tasks, and no family imports it."""
