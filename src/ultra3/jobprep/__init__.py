"""What a compiled job becomes before an executor submits it: the in-job command and Slurm request (plan), and
the job dir with its code (jobdir). Below the executors, which use it, and above nothing of theirs."""
