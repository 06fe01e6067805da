"""Modules of the data-prep runtimes (recipes/data_prep_pretrain.py, recipes/data_prep_sft.py), one per
concern. Imported with recipes/ on sys.path; they never import the launcher (`ultra3`): a job runs them
with only the `data` extra's packages and the standard library."""
