"""Reports over a store: tables, the performance check, the two-generation table, relations."""
