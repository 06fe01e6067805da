"""Modules of the data-prep runtimes (recipes.data_prep_pretrain, recipes.data_prep_sft), one per concern.
They never import the launcher (`ultra3`): a job runs them with only the `data` extra's packages and the
standard library."""
