"""Analysis of tracked runs: the tidy table (runs), statistics (stats, predictors), the study's claims
(claims, reference, claims/*.yaml), figures, and the report command (``python -m analysis.report``)."""
