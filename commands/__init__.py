"""The commands on top: the command line (`python -m mlperf ...`), the smoke gate, the SUT bench, the Server
peak search and the batch sweep, and the runs they make in child processes. Nothing below imports them."""
