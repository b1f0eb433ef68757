"""One command on every host: exec fan-out, ping, fetching a job's logs."""
