"""The jobs the commands run, each composed from the stages: plan (with the dependency check),
lock, build → gate → publish, pull, preflight. Each returns a value a view can show."""
