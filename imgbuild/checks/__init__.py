"""Checks that need no Docker: API drift between locked packages, compatibility patches
against locked wheels, a checkpoint against a target's engine (check-model), a server log
against known failures (doctor)."""
