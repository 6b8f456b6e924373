"""What ``gsync run`` exits with (README, "Exit codes"): its own module, so that the runner
(``io.runner``) and the command line (``ops.cli``) both read it and neither imports the other."""

# What ``gsync run`` exits with (README, "Exit codes"). Each failure at start says its cause
# and its fix in one line on stderr, never a traceback. The unit does not restart into 2, 3
# and 4 (RestartPreventExitStatus=): an operator must act first; 1, 5 and 6 may pass.
EXIT_OK, EXIT_FAILURE, EXIT_BAD_CONFIG = 0, 1, 2
# state_dir refused: another instance holds it, or a newer gsync wrote it
EXIT_STATE_REFUSED = 3
# state_dir or gsync.db may not be written: permissions, a read-only file system
EXIT_STATE_UNWRITABLE = 4
# the disk under state_dir is full or failing (an I/O error), or another program holds gsync.db
EXIT_STATE_DISK = 5
# [metrics] listen is taken by another process
EXIT_METRICS_PORT_BUSY = 6
RESTART_PREVENTED = (EXIT_BAD_CONFIG, EXIT_STATE_REFUSED, EXIT_STATE_UNWRITABLE)
