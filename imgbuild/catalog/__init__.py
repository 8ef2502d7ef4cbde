"""images/ read and validated: targets, model profiles, the hardware tables, patches and the
tables the checks use. Data, not decisions: every error names the file, the key and what was
expected."""
