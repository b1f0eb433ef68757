"""The SSH transport (asyncssh): connections, host keys, remote processes."""
