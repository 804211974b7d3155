"""The MLflow store: claims, runs, their names, params, tags and artifacts."""
