"""One module per command, each `run(args, out) -> exit code`: build the Workspace, make one
call into a stage, hand the result to a view (pip-tools' scripts/ are the model)."""
