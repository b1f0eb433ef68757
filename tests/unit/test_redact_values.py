"""Secret env values found by name and by value (corral.redact)."""

from __future__ import annotations

import pytest

from corral.redact import REDACTED, is_secret, looks_secret, redact_env, secret_keys


@pytest.mark.parametrize(
    "value",
    [
        "postgresql://app:s3cret@db:5432/x",
        "redis://:pw@cache:6379/0",
        "hf_" + "a1B2c3D4e5F6g7H8i9J0k1L2",
        "ghp_" + "a" * 36,
        "github_pat_" + "11ABCDEFG0" * 3,
        "glpat-" + "x" * 20,
        "sk-" + "proj-" + "Q" * 24,
        "sk_live_" + "9" * 24,
        "xoxb-" + "123456789012-abcdefABCDEF",
        "xoxp-" + "1-2-3-abcdefghij",
        "AKIA" + "IOSFODNN7EXAMPLE",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.sig-nature_x",
        "Bearer ghp_" + "b" * 36,
        "-----BEGIN OPENSSH PRIVATE KEY-----",
    ],
)
def test_a_credential_is_secret_whatever_its_name(value: str) -> None:
    assert looks_secret(value)
    assert is_secret("SOME_SETTING", value=value)
    assert redact_env({"SOME_SETTING": value}) == {"SOME_SETTING": REDACTED}


@pytest.mark.parametrize(
    "value",
    [
        "",
        "https://example.org/model.bin",
        "https://user@example.org/x",
        "sk-learn",
        "task-123",
        "AKIA",
        "/data/imagenet",
        "hf_small",
        "eyJ",
    ],
)
def test_plain_values_are_not(value: str) -> None:
    assert not looks_secret(value)
    assert not is_secret("SOME_SETTING", value=value)


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("DB_PASS", True),
        ("HF_AUTH", True),
        ("DATABASE_URL", True),
        ("SENTRY_DSN", True),
        ("MY_PWD", True),
        ("HF_TOKEN", True),
        ("AUTHOR", False),
        ("PASSES", False),
        ("BYPASS_CACHE", False),
        ("NCCL_DEBUG", False),
    ],
)
def test_names_like_secrets(name: str, secret: bool) -> None:
    assert is_secret(name) is secret


def test_secret_keys_lists_names_values_and_extra() -> None:
    env = {"A": "1", "DB_PASS": "x", "B": "hf_" + "z" * 24, "C": "2"}
    assert secret_keys(env, ["C"]) == ["DB_PASS", "B", "C"]
