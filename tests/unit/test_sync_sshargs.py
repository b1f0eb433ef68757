"""The ssh command ``corral sync`` gives rsync: every option, quoting, ``ssh -G``, askpass."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.cluster.model import Host
from corral.errors import ConfigError
from corral.sync.push import rsync_argv
from corral.sync.sshargs import (
    Resolved,
    askpass_env,
    has_hw_aes,
    parse_ssh_g,
    remote_target,
    reorder,
    resolve_host,
    rsh_command,
    rsync_quote,
    ssh_argv,
    tuning_options,
    write_askpass,
)
from corral.transport.options import SshOptions

NASTY = ["plain", "with space", "it's", 'dq"x', "a''b", "ünï côde", "$HOME", "-dash", "tab\tx"]


def opts(**kw: object) -> SshOptions:
    return SshOptions(**kw)  # type: ignore[arg-type]


def test_defaults_are_strict_and_batch() -> None:
    argv = ssh_argv(opts(), Host("h1"))
    assert argv[0] == "ssh"
    assert "-F" not in argv and "-p" not in argv and "-l" not in argv and "-i" not in argv
    pairs = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    assert "BatchMode=yes" in pairs
    assert "StrictHostKeyChecking=yes" in pairs
    assert "ServerAliveInterval=5" in pairs and "ServerAliveCountMax=3" in pairs
    assert not any(p.startswith("ConnectTimeout") for p in pairs)
    assert "-T" in argv and "-x" in argv


def test_every_option(tmp_path: Path) -> None:
    config = tmp_path / "my ssh config"
    config.write_text("Host *\n")
    key = tmp_path / "id key"
    key.write_text("not really a key")
    argv = ssh_argv(
        opts(user="ml", key=str(key), port=2222, config=str(config), accept_new_host_keys=True),
        Host("h1"),
        connect_timeout=2.6,
    )
    assert argv[argv.index("-F") + 1] == str(config)
    assert argv[argv.index("-p") + 1] == "2222"
    assert argv[argv.index("-l") + 1] == "ml"
    assert argv[argv.index("-i") + 1] == str(key)
    pairs = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    assert "IdentitiesOnly=yes" in pairs
    assert "StrictHostKeyChecking=accept-new" in pairs
    assert "ConnectTimeout=3" in pairs


def test_hostfile_port_and_user_win_over_options() -> None:
    argv = ssh_argv(opts(user="ml", port=2222), Host("h1", port=22022, user="root"))
    assert argv[argv.index("-p") + 1] == "22022"
    assert argv[argv.index("-l") + 1] == "root"


def test_password_mode_allows_prompts_once() -> None:
    argv = ssh_argv(opts(password_env="PW"), Host("h1"), password=True)
    pairs = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    assert "BatchMode=no" in pairs and "BatchMode=yes" not in pairs
    assert "NumberOfPasswordPrompts=1" in pairs


def test_missing_config_and_key_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--ssh-config"):
        ssh_argv(opts(config=str(tmp_path / "nope")), Host("h1"))
    with pytest.raises(ConfigError, match="--ssh-key"):
        ssh_argv(opts(key=str(tmp_path / "nope")), Host("h1"))


@pytest.mark.parametrize("word", NASTY)
def test_rsync_quote_plain_words_stay(word: str) -> None:
    quoted = rsync_quote(word)
    if " " not in word and "\t" not in word and "'" not in word and '"' not in word:
        assert quoted == word
    else:
        assert quoted.startswith("'") and quoted.endswith("'")


def test_remote_target_brackets_ipv6() -> None:
    assert remote_target("tb1") == "tb1"
    assert remote_target("fe80::1") == "[fe80::1]"


def _fake_ssh(tmp_path: Path) -> Path:
    """An "ssh" that records its argv as JSON and fails (rsync then gives up)."""
    script = tmp_path / "fake ssh's dir" / "ssh"
    script.parent.mkdir()
    record = tmp_path / "argv.json"
    script.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(record)!r}, 'w').write(json.dumps(sys.argv[1:]))\nsys.exit(255)\n"
    )
    script.chmod(0o755)
    return script


def test_rsync_passes_every_word_verbatim(tmp_path: Path) -> None:
    """rsync's own ``-e`` parser gets the words back exactly (spaces, quotes, unicode)."""
    fake = _fake_ssh(tmp_path)
    words = [str(fake), *NASTY, "-o", 'UserKnownHostsFile=/a b/it\'s "kh"']
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_text("x")
    files = tmp_path / "files"
    files.write_bytes(b"f\0")
    argv = rsync_argv(src=str(src), dest="/srv/a b", target="h1", ssh=words, files_from=str(files))
    subprocess.run(argv, capture_output=True, timeout=30)
    got = json.loads((tmp_path / "argv.json").read_text())
    assert got[: len(words) - 1] == words[1:]
    assert got[len(words) - 1] == "h1"
    remote = " ".join(got[len(words) :])
    assert remote.startswith("mkdir -p '/srv/a b' && rsync --server")


def test_rsh_command_joins_quoted() -> None:
    assert rsh_command(["ssh", "-F", "/a b/c", "-o", "X=1"]) == "ssh -F '/a b/c' -o X=1"


def test_parse_ssh_g() -> None:
    text = "user root\nhostname 10.0.0.2\nPort 22\nconnecttimeout none\nhostname ignored\n"
    assert parse_ssh_g(text) == {
        "user": "root",
        "hostname": "10.0.0.2",
        "port": "22",
        "connecttimeout": "none",
    }


def _fake_g(tmp_path: Path, answers: dict[str, str]) -> Path:
    script = tmp_path / "ssh-g"
    script.write_text(
        f"#!{sys.executable}\nimport sys\nanswers = {answers!r}\n"
        "name = sys.argv[-1]\n"
        "if name not in answers:\n    print('bad config line 3', file=sys.stderr); sys.exit(255)\n"
        "print(answers[name])\n"
    )
    script.chmod(0o755)
    return script


def test_resolve_alias_and_timeout(tmp_path: Path) -> None:
    answer = "hostname 10.77.0.1\nconnecttimeout 5\nkexalgorithms k1,k2\nciphers c1"
    fake = _fake_g(tmp_path, {"tb1": answer})
    res = asyncio.run(resolve_host(opts(), Host("tb1"), ssh=str(fake)))
    assert (res.target, res.hostname, res.config_timeout) == ("tb1", "10.77.0.1", True)
    assert res.algorithms == {"kexalgorithms": "k1,k2", "ciphers": "c1"}


def test_resolve_uses_hostfile_address_without_hostname(tmp_path: Path) -> None:
    fake = _fake_g(
        tmp_path,
        {"node-b": "hostname node-b\nconnecttimeout none", "10.0.0.9": "hostname 10.0.0.9"},
    )
    res = asyncio.run(resolve_host(opts(), Host("node-b", address="10.0.0.9"), ssh=str(fake)))
    assert res.target == "10.0.0.9" and not res.config_timeout


def test_resolve_bad_config_is_config_error(tmp_path: Path) -> None:
    fake = _fake_g(tmp_path, {})
    with pytest.raises(ConfigError, match="bad config line 3"):
        asyncio.run(resolve_host(opts(), Host("x"), ssh=str(fake)))


def test_askpass_prints_the_variable_and_holds_no_secret(tmp_path: Path) -> None:
    secret = "pa ss'w\"ord $x `y`"
    helper = write_askpass(tmp_path, "CORRAL_TEST_PW")
    assert secret not in helper.read_text()
    assert os.stat(helper).st_mode & 0o777 == 0o700
    env = askpass_env(helper, {"CORRAL_TEST_PW": secret, "PATH": os.environ["PATH"]})
    assert env["SSH_ASKPASS"] == str(helper) and env["SSH_ASKPASS_REQUIRE"] == "force"
    out = subprocess.run([env["SSH_ASKPASS"], "Password:"], env=env, capture_output=True)
    assert out.stdout.decode() == secret + "\n"


def test_askpass_refuses_bad_variable_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--ssh-password-env"):
        write_askpass(tmp_path, "A;rm -rf /")


BUILTIN = {
    "kexalgorithms": "sntrup761x25519-sha512@openssh.com,curve25519-sha256,"
    "curve25519-sha256@libssh.org,ecdh-sha2-nistp256",
    "ciphers": "chacha20-poly1305@openssh.com,aes128-ctr,aes128-gcm@openssh.com,"
    "aes256-gcm@openssh.com",
}


def test_reorder_only_moves_never_drops() -> None:
    assert reorder("a,b,c", ["c", "x"]) == "c,a,b"
    assert reorder("c,a,b", ["c"]) is None
    assert reorder("", ["c"]) is None


def test_tuning_reorders_builtin_lists_only() -> None:
    default = Resolved("tb1", "10.0.0.1", False, algorithms=dict(BUILTIN))
    options = tuning_options(default, BUILTIN)
    values = dict(o.split("=", 1) for o in options if o != "-o")
    assert values["KexAlgorithms"].split(",")[:2] == [
        "curve25519-sha256",
        "curve25519-sha256@libssh.org",
    ]
    assert sorted(values["KexAlgorithms"].split(",")) == sorted(BUILTIN["kexalgorithms"].split(","))
    assert values["Ciphers"].startswith("aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20")
    # the user's config chose its own lists: nothing is added
    chosen = Resolved("tb1", "10.0.0.1", False, algorithms={"kexalgorithms": "x", "ciphers": "y"})
    assert tuning_options(chosen, BUILTIN) == []
    # no AES instructions: ciphers stay as OpenSSH orders them
    assert "Ciphers" not in " ".join(tuning_options(default, BUILTIN, hw_aes=False))
    argv = ssh_argv(opts(), Host("tb1"), tuning=options)
    assert " ".join(options) in " ".join(argv)


@pytest.mark.parametrize(
    ("cpuinfo", "expected"),
    [
        ("processor : 0\nflags : fpu sse2 aes avx\n", True),
        ("processor : 0\nflags : fpu sse2 avx\n", False),
        ("Features : fp asimd aes pmull\n", True),
    ],
)
def test_has_hw_aes_reads_cpuinfo(
    monkeypatch: pytest.MonkeyPatch, cpuinfo: str, expected: bool
) -> None:
    real = Path.read_text

    def fake(self: Path, *args: object, **kw: object) -> str:
        if str(self) == "/proc/cpuinfo":
            return cpuinfo
        return real(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", fake)
    assert has_hw_aes() is expected


def test_insecure_turns_checking_off_only_when_asked() -> None:
    pairs = [a for a in ssh_argv(opts(insecure_no_host_key_check=True), Host("h1"))]
    assert "StrictHostKeyChecking=no" in pairs and "UserKnownHostsFile=/dev/null" in pairs
    strict = ssh_argv(opts(accept_new_host_keys=True), Host("h1"))
    assert "StrictHostKeyChecking=accept-new" in strict
    assert "UserKnownHostsFile=/dev/null" not in strict
