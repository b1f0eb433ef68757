"""Hostfile, cluster-file and ``--hosts`` parsing (corral.cluster)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import corral.cluster as cluster_pkg
from corral.cluster import (
    LOCAL_ADDRESS,
    Cluster,
    Host,
    detect_format,
    expand_hostlist,
    load_cluster,
    load_cluster_file,
    local_cluster,
    parse_host_list,
    parse_hostfile_text,
    parse_mlx_hostfile,
    parse_yaml_cluster,
)
from corral.errors import ConfigError


def names(cluster: Cluster) -> list[str]:
    return [h.name for h in cluster]


def config_error(func: object, *args: object, **kwargs: object) -> ConfigError:
    assert callable(func)
    with pytest.raises(ConfigError) as info:
        func(*args, **kwargs)
    return info.value


# --------------------------------------------------------------------------- public API


def test_public_api_is_explicit() -> None:
    assert set(cluster_pkg.__all__) == {
        "HOSTFILE_KEYS",
        "LOCAL_ADDRESS",
        "MAX_HOSTS",
        "Cluster",
        "Host",
        "HostfileFormat",
        "detect_format",
        "expand_hostlist",
        "load_cluster",
        "load_cluster_file",
        "local_cluster",
        "parse_host_list",
        "parse_hostfile_text",
        "parse_mlx_hostfile",
        "parse_yaml_cluster",
    }
    for name in cluster_pkg.__all__:
        assert hasattr(cluster_pkg, name)


# --------------------------------------------------------------------------- text hostfile


SEED_STYLE = """\
# seed style: host[:slots]
node1.example.com:4
# DeepSpeed / Horovod style
node2 slots=8
# extra keys
node3:8 port=2222 user=ml interface=eth1
# ranges (Slurm-style)
gpu[01-04]:8
"""


def test_design_example_parses_with_every_field() -> None:
    c = parse_hostfile_text(SEED_STYLE, "hf")
    assert names(c) == ["node1.example.com", "node2", "node3", "gpu01", "gpu02", "gpu03", "gpu04"]
    assert [h.slots for h in c] == [4, 8, 8, 8, 8, 8, 8]
    node3 = c.host("node3")
    assert (node3.port, node3.user, node3.interface) == (2222, "ml", "eth1")
    assert node3.address == "node3"
    assert c.host("node1.example.com").port is None
    assert c.host("node2").user is None
    assert c.source == "hf"
    assert c.total_slots == 4 + 8 + 8 + 4 * 8
    assert not c.is_local


def test_host_without_slots_gets_one() -> None:
    c = parse_hostfile_text("alpha\nbeta\n")
    assert [(h.name, h.slots) for h in c] == [("alpha", 1), ("beta", 1)]
    assert c.source == "<hosts>"


def test_bare_ipv4_with_slots() -> None:
    (host,) = parse_hostfile_text("10.0.0.1:4\n")
    assert (host.name, host.address, host.slots) == ("10.0.0.1", "10.0.0.1", 4)


def test_address_label_and_env_keys() -> None:
    text = 'node1:2 address=10.1.0.1 label.rack=r7 label.gpu=a100 env.NCCL_DEBUG=INFO env.X="a b"\n'
    (host,) = parse_hostfile_text(text)
    assert host.address == "10.1.0.1"
    assert dict(host.labels) == {"rack": "r7", "gpu": "a100"}
    assert dict(host.env) == {"NCCL_DEBUG": "INFO", "X": "a b"}


def test_env_value_may_contain_equals_and_backslash() -> None:
    (host,) = parse_hostfile_text("n env.OPTS=a=b env.P=C:\\dir\n")
    assert dict(host.env) == {"OPTS": "a=b", "P": "C:\\dir"}


def test_user_at_host_prefix() -> None:
    (host,) = parse_hostfile_text("ml@node1:4\n")
    assert (host.name, host.user, host.slots) == ("node1", "ml", 4)


def test_comments_blank_lines_and_whitespace_are_ignored() -> None:
    text = "\n   \n# only a comment\n  node1:2   # trailing comment\n\tnode2 slots=3 # x\n"
    c = parse_hostfile_text(text)
    assert [(h.name, h.slots) for h in c] == [("node1", 2), ("node2", 3)]


def test_order_is_kept_first_host_is_node_zero() -> None:
    c = parse_hostfile_text("zeta\nalpha\nmid\n")
    assert names(c) == ["zeta", "alpha", "mid"]


def test_range_keys_apply_to_every_expanded_host() -> None:
    c = parse_hostfile_text("n[1-3]:2 port=2200 label.pool=a\n")
    assert names(c) == ["n1", "n2", "n3"]
    assert {(h.slots, h.port, dict(h.labels)["pool"]) for h in c} == {(2, 2200, "a")}


# --------------------------------------------------------------------------- ranges


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("gpu[01-04]", ["gpu01", "gpu02", "gpu03", "gpu04"]),
        ("n[1-3,7]", ["n1", "n2", "n3", "n7"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("n[001-002,010]", ["n001", "n002", "n010"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("node[5]", ["node5"]),
        ("[1-2]x.lan", ["1x.lan", "2x.lan"]),
        ("plain", ["plain"]),
    ],
)
def test_expand_hostlist(pattern: str, expected: list[str]) -> None:
    assert expand_hostlist(pattern) == expected


@pytest.mark.parametrize(
    ("pattern", "wording"),
    [
        ("gpu[04-01]", "'04-01' goes backwards: expected LOW <= HIGH"),
        ("gpu[a-b]", "'a-b' is not a number or range: expected comma-separated numbers"),
        ("gpu[1-]", "'1-' is not a number or range"),
        ("gpu[01-04", "unclosed '[': expected NAME[LOW-HIGH]"),
        ("gpu01-04]", "']' without a matching '['"),
        ("gpu[]", "empty '[]'"),
        ("gpu[1,,2]", "'' is not a number or range"),
        ("g[1-2[3]]", "nested '['"),
        ("n[1-70000]", "has 70000 values: expected at most 65536 hosts"),
        ("a[1-300]b[1-300]", "expands to 90000 hosts: expected at most 65536"),
    ],
)
def test_expand_hostlist_errors(pattern: str, wording: str) -> None:
    err = config_error(expand_hostlist, pattern)
    assert f"bad range in {pattern!r}" in str(err)
    assert wording in str(err)


def test_bad_range_in_hostfile_names_file_and_line() -> None:
    err = config_error(parse_hostfile_text, "ok1\nok2\ngpu[04-01]:8\n", "cluster.txt")
    assert str(err).startswith("cluster.txt:3: bad range in 'gpu[04-01]'")
    assert (err.source, err.line) == ("cluster.txt", 3)


# --------------------------------------------------------------------------- text errors


@pytest.mark.parametrize(
    ("text", "line", "wording"),
    [
        # duplicates, also across a range and a plain line
        ("a\nb\na:2\n", 3, "duplicate host 'a' (first defined on line 1): expected each host once"),
        ("n[1-3]\nn2\n", 2, "duplicate host 'n2' (first defined on line 1)"),
        ("n[1-2,2]\n", 1, "duplicate host 'n2' (first defined on line 1)"),
        # slots
        ("a:0\n", 1, "invalid slots '0': expected a positive integer"),
        ("a\nb slots=0\n", 2, "invalid slots '0': expected a positive integer"),
        ("a:-1\n", 1, "invalid slots '-1': expected a positive integer"),
        ("a:four\n", 1, "invalid slots 'four': expected a positive integer"),
        ("a:2.5\n", 1, "invalid slots '2.5': expected a positive integer"),
        ("a:\n", 1, "invalid slots '': expected a positive integer"),
        ("a:2 slots=4\n", 1, "slots given twice ('a:2' and 'slots=4'): expected either"),
        # unknown keys (the allowed ones are listed)
        (
            "a gpus=8\n",
            1,
            "unknown key 'gpus': expected one of slots, port, user, interface, address, "
            "label.NAME, env.NAME",
        ),
        ("a slot=8\n", 1, "unknown key 'slot' (did you mean 'slots'?)"),
        ("a max_slots=8\n", 1, "unknown key 'max_slots'"),
        # ports
        ("a port=0\n", 1, "invalid port '0': expected an integer from 1 to 65535"),
        ("a port=65536\n", 1, "invalid port '65536': expected an integer from 1 to 65535"),
        ("a port=ssh\n", 1, "invalid port 'ssh': expected an integer from 1 to 65535"),
        # unparseable lines
        ("a 8\n", 1, "unexpected '8' after the host name: expected key=value"),
        ("slots=8\n", 1, "expected a host name first, got 'slots=8'"),
        ("a:1:2\n", 1, "cannot parse host 'a:1:2': expected HOST or HOST:SLOTS"),
        ("fe80::1\n", 1, "cannot parse host 'fe80::1': expected HOST or HOST:SLOTS"),
        (":4\n", 1, "missing host name in ':4': expected HOST or HOST:SLOTS"),
        ("no/slash\n", 1, "invalid host name 'no/slash': expected a host name made of letters"),
        (
            'a env.X="open\n',
            1,
            "cannot parse line (No closing quotation): expected matching quotes",
        ),
        ("@a\n", 1, "empty user in '@a': expected USER@HOST"),
        # keys given twice / empty / invalid names
        ("a port=1 port=2\n", 1, "key 'port' given twice: expected each key once per line"),
        ("a env.X=1 env.X=2\n", 1, "env.X given twice"),
        ("a label.k=1 label.k=2\n", 1, "label.k given twice"),
        ("a user=\n", 1, "empty value for 'user': expected user=VALUE"),
        ("u@a user=v\n", 1, "user given twice ('u@a' and 'user=v')"),
        ("a env.1X=1\n", 1, "invalid environment variable name '1X': expected letters, digits"),
        ("a env.=1\n", 1, "invalid environment variable name ''"),
        ("a label.=1\n", 1, "invalid label name '': expected letters"),
        ("n[1-2] address=10.0.0.9\n", 1, "expected one address per host"),
    ],
)
def test_text_errors_name_file_line_and_expectation(text: str, line: int, wording: str) -> None:
    err = config_error(parse_hostfile_text, text, "hosts.txt")
    assert (err.source, err.line) == ("hosts.txt", line)
    assert str(err).startswith(f"hosts.txt:{line}: ")
    assert wording in str(err)


def test_line_numbers_count_comments_and_blank_lines() -> None:
    text = "# header\n\nnode1\n   # indented comment\n\nnode2 ports=1\n"
    err = config_error(parse_hostfile_text, text, "hosts.txt")
    assert str(err).startswith("hosts.txt:6: unknown key 'ports' (did you mean 'port'?)")


@pytest.mark.parametrize("text", ["", "\n\n", "# just comments\n  # and more\n"])
def test_empty_hostfile_is_an_error(text: str) -> None:
    err = config_error(parse_hostfile_text, text, "empty.txt")
    assert str(err) == "empty.txt: no hosts in hostfile: expected at least one line like 'node1:8'"


# --------------------------------------------------------------------------- comma lists


def test_comma_list() -> None:
    c = parse_host_list("h1,h2:4,gpu[01-02]:8,n[1-2,5]")
    assert names(c) == ["h1", "h2", "gpu01", "gpu02", "n1", "n2", "n5"]
    assert [h.slots for h in c] == [1, 4, 8, 8, 1, 1, 1]
    assert c.source == "h1,h2:4,gpu[01-02]:8,n[1-2,5]"


def test_comma_list_ignores_empty_items() -> None:
    assert names(parse_host_list("solo,")) == ["solo"]
    assert names(parse_host_list(" a , ,b ")) == ["a", "b"]


def test_comma_list_errors_name_option_and_entry() -> None:
    err = config_error(parse_host_list, "a,b,a")
    assert str(err).startswith("--hosts: entry 3: duplicate host 'a' (first defined on entry 1)")
    assert err.option == "--hosts"
    err = config_error(parse_host_list, "a,b:0")
    assert str(err) == (
        "--hosts: entry 2: invalid slots '0': expected a positive integer (e.g. slots=8)"
    )
    err = config_error(parse_host_list, ",,")
    assert "no hosts in ',,'" in str(err)


# --------------------------------------------------------------------------- local:N


def test_local_cluster() -> None:
    c = load_cluster("local:3")
    assert names(c) == ["local-0", "local-1", "local-2"]
    assert all(h.local and h.slots == 1 and h.address == LOCAL_ADDRESS for h in c)
    assert c.is_local
    assert c.source == "local:3"
    assert local_cluster(1).hosts == (
        Host(name="local-0", address="127.0.0.1", slots=1, local=True),
    )


@pytest.mark.parametrize("spec", ["local:0", "local:-1", "local:x", "local:", "local:1.5"])
def test_local_cluster_needs_positive_int(spec: str) -> None:
    err = config_error(load_cluster, spec)
    assert err.option == "--hosts"
    assert str(err).startswith("--hosts: ")
    assert "expected local:N with N" in str(err)


def test_ssh_defaults_do_not_apply_to_local_nodes() -> None:
    c = load_cluster("local:2", ssh_user="root", ssh_port=2222)
    assert all(h.user is None and h.port is None for h in c)


# --------------------------------------------------------------------------- YAML


YAML_CLUSTER = """\
# a cluster file
defaults:
  user: ml
  port: 2222
  slots: 2
  interface: eth0
  env:
    NCCL_DEBUG: INFO
    OMP_NUM_THREADS: 4
    NCCL_IB_DISABLE: true
  labels:
    site: lab
hosts:
  - node1:8 port=22 env.EXTRA=1
  - name: node2
    address: 10.0.0.2
    slots: 4
    user: root
    interface: ib0
    env:
      OMP_NUM_THREADS: 8
    labels:
      gpu: a100
      ib: true
  - name: gpu[01-02]
"""


def test_yaml_cluster_with_defaults_and_overrides() -> None:
    c = parse_yaml_cluster(YAML_CLUSTER, "c.yaml")
    assert names(c) == ["node1", "node2", "gpu01", "gpu02"]
    node1, node2, gpu01, _ = c.hosts
    assert (node1.slots, node1.port, node1.user, node1.interface) == (8, 22, "ml", "eth0")
    assert dict(node1.env) == {
        "NCCL_DEBUG": "INFO",
        "OMP_NUM_THREADS": "4",
        "NCCL_IB_DISABLE": "1",
        "EXTRA": "1",
    }
    assert (node2.address, node2.slots, node2.port, node2.user, node2.interface) == (
        "10.0.0.2",
        4,
        2222,
        "root",
        "ib0",
    )
    assert dict(node2.env)["OMP_NUM_THREADS"] == "8"
    assert dict(node2.env)["NCCL_DEBUG"] == "INFO"
    assert dict(node2.labels) == {"site": "lab", "gpu": "a100", "ib": "true"}
    assert (gpu01.slots, gpu01.user, gpu01.address) == (2, "ml", "gpu01")
    assert c.source == "c.yaml"


def test_yaml_without_defaults() -> None:
    c = parse_yaml_cluster("hosts:\n  - a\n  - name: b\n")
    assert [(h.name, h.slots, h.user) for h in c] == [("a", 1, None), ("b", 1, None)]


@pytest.mark.parametrize(
    ("text", "line", "wording"),
    [
        ("hosts:\n  - a\n  - name: b\n    slots: 0\n", 4, "invalid slots 0: expected a positive"),
        ("hosts:\n  - name: b\n    slots: '4'\n", 3, "invalid slots '4': expected a positive"),
        ("hosts:\n  - name: b\n    slots: true\n", 3, "invalid slots True: expected a positive"),
        ("hosts:\n  - name: b\n    port: 70000\n", 3, "invalid port 70000: expected an integer"),
        (
            "hosts:\n  - a\n  - name: b\n    gpus: 3\n",
            4,
            "unknown key 'gpus': expected one of name, address, slots, port, user, interface, "
            "env, labels",
        ),
        ("hosts:\n  - a\n  - slots: 3\n", 3, "missing required key 'name': expected a host name"),
        ("hosts:\n  - a\n  - name: a\n", 3, "duplicate host 'a' (first defined on line 2)"),
        ("hosts:\n  - n[1-2]\n  - n2\n", 3, "duplicate host 'n2' (first defined on line 2)"),
        ("hosts:\n  - a\n  - b foo=1\n", 3, "unknown key 'foo': expected one of slots"),
        ("hosts:\n  - a\n  - 3\n", 3, "invalid host 3 (hosts item 2): expected a host line"),
        ("hosts:\n  - name: n[2-1]\n", 2, "bad range in 'n[2-1]'"),
        ("hosts:\n  - name: 'x y'\n", 2, "invalid host name 'x y'"),
        ("hosts:\n  - name: a\n    env:\n      1BAD: x\n", 4, "invalid environment variable name"),
        ("hosts:\n  - name: a\n    env:\n      OK: [1]\n", 4, "invalid env.OK [1]: expected a str"),
        (
            "hosts:\n  - name: a\n    env:\n      port: {}\n",
            4,
            "invalid env.port {}: expected a str",
        ),
        ("hosts:\n  - name: a\n    labels: [x]\n", 3, "invalid labels ['x']: expected a mapping"),
        ("hosts:\n  - name: a\n    name: b\n", 3, "duplicate key 'name' (first on line 2)"),
        ("hosts: [a]\nextra: 1\n", 2, "unknown key 'extra': expected one of hosts, defaults"),
        ("defaults:\n  port: 0\nhosts: [a]\n", 2, "invalid defaults.port 0: expected an integer"),
        (
            "defaults:\n  name: x\nhosts: [a]\n",
            2,
            "unknown key 'name': expected one of slots, port, user, interface, env, labels",
        ),
        ("hosts: []\n", 1, "invalid hosts []: expected a non-empty list"),
        ("defaults: {}\n", 1, "missing required key 'hosts'"),
        ("- a\n- b\n", 1, "top level is list): expected a mapping with a 'hosts:' list"),
        ("hosts:\n  - a\n - b\n", 3, "invalid YAML ("),
    ],
)
def test_yaml_errors_name_file_and_line(text: str, line: int, wording: str) -> None:
    err = config_error(parse_yaml_cluster, text, "c.yaml")
    assert (err.source, err.line) == ("c.yaml", line), str(err)
    assert str(err).startswith(f"c.yaml:{line}: ")
    assert wording in str(err)


@pytest.mark.parametrize("text", ["", "# nothing\n"])
def test_yaml_empty_file(text: str) -> None:
    err = config_error(parse_yaml_cluster, text, "c.yaml")
    assert str(err) == "c.yaml: no hosts in cluster file: expected a mapping with a 'hosts:' list"


# --------------------------------------------------------------------------- MLX JSON


def test_mlx_list_form() -> None:
    text = json.dumps(
        [
            {"ssh": "mac1", "ips": ["10.0.0.1", "10.0.1.1"]},
            {"ssh": "mac2", "ips": []},
            {"ssh": "ml@mac3", "slots": 2},
        ]
    )
    c = parse_mlx_hostfile(text, "h.json")
    assert [(h.name, h.address, h.slots, h.user) for h in c] == [
        ("mac1", "10.0.0.1", 1, None),
        ("mac2", "mac2", 1, None),
        ("mac3", "mac3", 2, "ml"),
    ]


def test_mlx_object_form_with_envs_and_rdma() -> None:
    text = json.dumps(
        {
            "backend": "jaccl",
            "envs": ["MLX_METAL_FAST_SYNCH=1"],
            "hosts": [
                {"ssh": "mac1", "ips": ["10.0.0.1"], "rdma": [None, "rdma_en2"]},
                {"ssh": "mac2", "ips": ["10.0.0.2"], "rdma": ["rdma_en2", None]},
            ],
        }
    )
    c = parse_mlx_hostfile(text)
    assert [(h.name, h.address) for h in c] == [("mac1", "10.0.0.1"), ("mac2", "10.0.0.2")]
    assert all(dict(h.env) == {"MLX_METAL_FAST_SYNCH": "1"} for h in c)


MLX_LINES = '[\n  {"ssh": "h1"},\n\n  BAD\n]\n'


@pytest.mark.parametrize(
    ("bad_item", "wording"),
    [
        ('{"ips": ["10.0.0.2"]}', "entry 2: missing required key 'ssh': expected a non-empty"),
        ('{"ssh": "h2", "foo": 1}', "entry 2: unknown key 'foo': expected one of ssh, ips, rdma"),
        ('{"ssh": "h2", "slots": 0}', "entry 2: invalid slots 0: expected a positive integer"),
        ('{"ssh": "h2", "ips": "10.0.0.2"}', "entry 2: invalid ips '10.0.0.2': expected a list"),
        ('{"ssh": ""}', "entry 2: invalid ssh '': expected a non-empty string"),
        ('{"ssh": "h2:4"}', "entry 2: invalid ssh 'h2:4': expected a host name"),
        ('{"ssh": "h1"}', "entry 2: duplicate host 'h1' (first defined on line 2)"),
        ('"h2"', "entry 2: invalid host 'h2': expected an object like {\"ssh\""),
    ],
)
def test_mlx_errors_name_file_line_and_entry(bad_item: str, wording: str) -> None:
    err = config_error(parse_mlx_hostfile, MLX_LINES.replace("BAD", bad_item), "h.json")
    assert (err.source, err.line) == ("h.json", 4)
    assert str(err).startswith(f"h.json:4: {wording}")


def test_mlx_object_form_error_lines() -> None:
    text = '{\n  "hosts": [\n    {"ssh": "a"},\n    {"ssh": "b", "slots": -1}\n  ]\n}\n'
    err = config_error(parse_mlx_hostfile, text, "h.json")
    assert str(err).startswith("h.json:4: entry 2: invalid slots -1")


@pytest.mark.parametrize(
    ("text", "wording"),
    [
        ('[\n  {"ssh": "h1",}\n]', "h.json:2: invalid JSON (Expecting property name"),
        ("[]", "h.json: no hosts in MLX hostfile"),
        ('"x"', "h.json: invalid MLX hostfile (top level is a JSON str): expected a list"),
        ('{"hostz": []}', "h.json: unknown key 'hostz': expected one of hosts, backend, envs"),
        (
            '{"envs": ["NOEQ"], "hosts": [{"ssh": "a"}]}',
            "h.json: invalid envs item 'NOEQ': expected 'NAME=value'",
        ),
    ],
)
def test_mlx_file_errors(text: str, wording: str) -> None:
    err = config_error(parse_mlx_hostfile, text, "h.json")
    assert str(err).startswith(wording)
    assert err.source == "h.json"


# --------------------------------------------------------------------------- detection


@pytest.mark.parametrize(
    ("text", "path", "expected"),
    [
        ("a\n", "hosts.yaml", "yaml"),
        ("a\n", "hosts.YML", "yaml"),
        ("# c\n\nhosts:\n  - a\n", "hostfile", "yaml"),
        ("defaults: {}\nhosts: [a]\n", None, "yaml"),
        ("---\nhosts: [a]\n", None, "yaml"),
        ('[{"ssh": "a"}]', "hostfile", "json"),
        ('  {"hosts": []}', None, "json"),
        ("a\n", "h.json", "json"),
        ("hosts:4\nb\n", None, "text"),
        ("gpu[01-02]:8\n", "hosts.txt", "text"),
        ("# hosts: in a comment\nnode1\n", None, "text"),
    ],
)
def test_detect_format(text: str, path: str | None, expected: str) -> None:
    assert detect_format(text, path) == expected


# --------------------------------------------------------------------------- load_cluster


def test_load_text_file_with_ssh_defaults(tmp_path: Path) -> None:
    path = tmp_path / "hostfile"
    path.write_text("node1:4\nnode2 user=alice port=2200\n")
    c = load_cluster(str(path), ssh_user="bob", ssh_port=22)
    assert c.source == str(path)
    assert [(h.name, h.user, h.port) for h in c] == [
        ("node1", "bob", 22),
        ("node2", "alice", 2200),
    ]
    plain = load_cluster(str(path))
    assert [(h.user, h.port) for h in plain] == [(None, None), ("alice", 2200)]


def test_load_yaml_by_extension_and_by_content(tmp_path: Path) -> None:
    by_ext = tmp_path / "cluster.yml"
    by_ext.write_text("hosts:\n  - name: a\n    slots: 2\n  - b\n")
    by_content = tmp_path / "cluster"
    by_content.write_text("hosts:\n  - name: a\n    slots: 2\n  - b\n")
    for path in (by_ext, by_content):
        c = load_cluster(str(path), ssh_user="u")
        assert [(h.name, h.slots, h.user) for h in c] == [("a", 2, "u"), ("b", 1, "u")]


def test_yaml_defaults_win_over_ssh_options(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("defaults:\n  user: filed\nhosts: [a]\n")
    (host,) = load_cluster(str(path), ssh_user="cli", ssh_port=2022)
    assert (host.user, host.port) == ("filed", 2022)


def test_load_mlx_json_by_content(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text('[{"ssh": "m1", "ips": ["10.0.0.1"]}, {"ssh": "m2", "ips": ["10.0.0.2"]}]')
    c = load_cluster(str(path), ssh_port=2222)
    assert [(h.name, h.address, h.port) for h in c] == [
        ("m1", "10.0.0.1", 2222),
        ("m2", "10.0.0.2", 2222),
    ]


def test_errors_from_files_name_the_path(tmp_path: Path) -> None:
    path = tmp_path / "hosts.txt"
    path.write_text("a\nb\na\n")
    err = config_error(load_cluster, str(path))
    assert str(err).startswith(f"{path}:3: duplicate host 'a' (first defined on line 1)")
    yml = tmp_path / "c.yaml"
    yml.write_text("hosts:\n  - a\n  - name: b\n    slots: -2\n")
    err = config_error(load_cluster, str(yml))
    assert str(err).startswith(f"{yml}:4: invalid slots -2")


def test_existing_file_wins_over_comma_list(tmp_path: Path) -> None:
    path = tmp_path / "a,b"
    path.write_text("from-file\n")
    assert names(load_cluster(str(path))) == ["from-file"]


def test_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    err = config_error(load_cluster, str(missing))
    assert err.option == "--hosts"
    assert f"hostfile '{missing}' not found" in str(err)
    assert "expected an existing file, local:N or a comma-separated host list" in str(err)


def test_single_name_that_is_not_a_file_is_one_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert names(load_cluster("node1")) == ["node1"]
    assert names(load_cluster("node1,")) == ["node1"]
    (host,) = load_cluster("ml@gpu-1.example.com:4", ssh_port=2200).hosts
    assert (host.name, host.user, host.slots, host.port) == ("gpu-1.example.com", "ml", 4, 2200)


def test_single_name_that_is_a_file_is_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "node1").write_text("from-file\n")
    assert names(load_cluster("node1")) == ["from-file"]


@pytest.mark.parametrize(
    "spec", ["hosts.txt", "cluster.yaml", "c.YML", "mlx.json", "x.hosts", "dir/x", "~/h", "./h"]
)
def test_missing_path_like_value_is_named_as_a_missing_hostfile(
    spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    err = config_error(load_cluster, spec)
    assert err.option == "--hosts"
    assert f"hostfile {spec!r} not found" in str(err)


def test_single_bad_host_name_is_a_host_list_error() -> None:
    err = config_error(load_cluster, "no de")
    assert err.option == "--hosts"
    assert "not found" not in str(err)


def test_load_comma_list_with_ssh_defaults() -> None:
    c = load_cluster("h1,h2:4", ssh_user="ml", ssh_port=2200)
    assert [(h.name, h.slots, h.user, h.port) for h in c] == [
        ("h1", 1, "ml", 2200),
        ("h2", 4, "ml", 2200),
    ]


def test_directory_is_not_a_hostfile(tmp_path: Path) -> None:
    err = config_error(load_cluster, str(tmp_path))
    assert "is a directory: expected a file" in str(err)


def test_load_cluster_file_missing(tmp_path: Path) -> None:
    err = config_error(load_cluster_file, tmp_path / "x")
    assert "not found" in str(err)


@pytest.mark.parametrize(
    ("kwargs", "option", "wording"),
    [
        ({"ssh_port": 0}, "--ssh-port", "invalid port 0: expected an integer from 1 to 65535"),
        ({"ssh_port": 70000}, "--ssh-port", "invalid port 70000"),
        ({"ssh_user": " "}, "--ssh-user", "empty user: expected a user name"),
    ],
)
def test_bad_ssh_options(kwargs: dict[str, object], option: str, wording: str) -> None:
    err = config_error(load_cluster, "a,b", **kwargs)
    assert err.option == option
    assert wording in str(err)


def test_empty_spec() -> None:
    err = config_error(load_cluster, "  ")
    assert str(err).startswith("--hosts: empty value: expected")


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_bytes(b"\xef\xbb\xbfnode1:2\n")
    assert [(h.name, h.slots) for h in load_cluster(str(path))] == [("node1", 2)]


# --------------------------------------------------------------------------- import cost

_SRC = str(Path(cluster_pkg.__file__).resolve().parents[2])
_NO_HEAVY = (
    "import sys\n"
    "heavy = sorted(m for m in ('pydantic', 'yaml', 'corral.cluster._structured')"
    " if m in sys.modules)\n"
    "assert not heavy, heavy\n"
)


def run_fresh(code: str, cwd: Path) -> None:
    """Run ``code`` in a fresh interpreter (sys.modules here already holds pydantic)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([_SRC, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "code",
    [
        "import corral.cluster",
        "import corral.cluster; corral.cluster.load_cluster('local:2')",
        "import corral.cluster; corral.cluster.load_cluster('n1,n2:4,gpu[01-02]:8')",
        "import corral.cluster; corral.cluster.load_cluster('hosts.txt', ssh_user='ml')",
        "import corral.cluster; corral.cluster.detect_format('hosts: [a]')",
        # error paths too: a text hostfile error must not drag the YAML parser in
        "from corral.cluster import parse_hostfile_text\n"
        "from corral.errors import ConfigError\n"
        "try:\n    parse_hostfile_text('n1 slot=2', 'hf')\n"
        "except ConfigError as exc:\n    assert \"did you mean 'slots'\" in str(exc), exc\n"
        "else:\n    raise AssertionError('no error')",
    ],
    ids=["import", "local", "comma-list", "text-file", "detect", "text-error"],
)
def test_text_forms_import_neither_pydantic_nor_yaml(code: str, tmp_path: Path) -> None:
    (tmp_path / "hosts.txt").write_text("node1:4\nnode2 slots=8 port=2222\n", encoding="utf-8")
    run_fresh(f"{code}\n{_NO_HEAVY}", tmp_path)


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("c.yaml", "hosts:\n  - node1:4\n  - name: node2\n    slots: 2\n", 6),
        ("c.json", '[{"ssh": "h1", "ips": ["10.0.0.1"], "slots": 3}]', 3),
    ],
)
def test_structured_files_load_their_parser_on_first_use(
    name: str, text: str, expected: int, tmp_path: Path
) -> None:
    (tmp_path / name).write_text(text, encoding="utf-8")
    run_fresh(
        "import sys, corral.cluster\n"
        f"assert corral.cluster.load_cluster({name!r}).total_slots == {expected}\n"
        "assert 'corral.cluster._structured' in sys.modules",
        tmp_path,
    )
