"""The in-job runtime (`python -m recipes.launch --config config.yaml`); it never imports the launcher `ultra3`."""
