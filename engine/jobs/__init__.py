"""Jobs: planning, submission, scheduling, task-group reports and their roll-up, checkpoints and
recovery: every state change of a job, its pipelines and task groups."""
