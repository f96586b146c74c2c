"""The investigation notebooks: run in batch with papermill, opened in JupyterLab, and what they show."""
