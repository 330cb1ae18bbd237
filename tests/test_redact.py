"""Tests for events.redact: secrets never reach the journal (M9).

Fake secrets are assembled at run time from repeated pieces, so that no string in this file looks
like a live credential to a secret scanner, yet each one has the shape the redactor must catch.
"""

from __future__ import annotations

import ast
import string
import sys
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from secret_corpus import LOOK_ALIKES, SECRETS

from journaled.events import redact as redact_module
from journaled.events.redact import _RULES, REDACTED, _scan, find_secrets, redact

OPENAI = "sk-" + "a1B2c3D4e5" * 5
OPENAI_PROJ = "sk-proj-" + "Ab3_x9-Kq2" * 8
ANTHROPIC = "sk-ant-api03-" + "Zq7-Lm2_Pw" * 9
AWS_ID = "AKIA" + "IOSFODNN7EXAMPLE"
AWS_SESSION_ID = "ASIA" + "Q3EXAMPLE0000000"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY"
GITHUB_SUFFIX = "R4nd0mT0k3n" * 4
GITLAB = "glpat-" + "x1Y2z3W4v5" * 2
SLACK = "xoxb-" + "1234567890-" * 2 + "AbCdEfGhIjKl"
JWT = ".".join(
    [
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9",
        "eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ",
        "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
    ]
)
PEM_BODY = "MIIEowIBAAKCAQEA" + "q7Bx" * 16
PEM = f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n{PEM_BODY}\n-----END RSA PRIVATE KEY-----"
BEARER = "8f3a" * 6 + "Zz"
BASIC = "dXNlcjpodW50ZXIy"

# (text, the secret that must vanish, the kind find_secrets must report)
POSITIVE: list[tuple[str, str, str]] = [
    (f"OPENAI_API_KEY {OPENAI} in the env", OPENAI, "openai-key"),
    (f"client = OpenAI(api_key_value={OPENAI_PROJ!r})", OPENAI_PROJ, "openai-key"),
    (f"use {ANTHROPIC} for claude", ANTHROPIC, "anthropic-key"),
    (f"aws id {AWS_ID} rotated", AWS_ID, "aws-access-key-id"),
    (f"session {AWS_SESSION_ID}", AWS_SESSION_ID, "aws-access-key-id"),
    (f"aws_secret_access_key = {AWS_SECRET}", AWS_SECRET, "aws-secret-access-key"),
    (f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}", AWS_SECRET, "aws-secret-access-key"),
    (f'"aws_secret_access_key": "{AWS_SECRET}"', AWS_SECRET, "aws-secret-access-key"),
    *[
        (f"git push with {prefix}{GITHUB_SUFFIX}", f"{prefix}{GITHUB_SUFFIX}", "github-token")
        for prefix in ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_11AB_")
    ],
    (f"GITLAB_TOKEN is {GITLAB}", GITLAB, "gitlab-token"),
    *[
        (
            f"slack {SLACK.replace('xoxb', 'xox' + c)}",
            SLACK.replace("xoxb", "xox" + c),
            "slack-token",
        )
        for c in "abpors"
    ],
    (f"cookie session={JWT}; path=/", JWT, "jwt"),
    (f"key follows\n{PEM}\nand then more", PEM_BODY, "private-key"),
    ("password=hunter2", "hunter2", "credential-assignment"),
    ("PASSWORD=hunter2 ./run.sh", "hunter2", "credential-assignment"),
    ("passwd: 's3cr3t pass'", "s3cr3t pass", "credential-assignment"),
    ('{"pwd": "hunter2", "user": "bob"}', "hunter2", "credential-assignment"),
    ("login with user bob Password: hunter2 then", "hunter2", "credential-assignment"),
    ("token=abc123def", "abc123def", "credential-assignment"),
    ("https://api.example.com/v1?Token=q9w8e7&page=2", "q9w8e7", "credential-assignment"),
    (
        "Secret: correct horse battery staple",
        "correct horse battery staple",
        "credential-assignment",
    ),
    ("API_KEY='z9y8x7w6'", "z9y8x7w6", "credential-assignment"),
    ("apikey = z9y8x7w6", "z9y8x7w6", "credential-assignment"),
    ("DB_PASSWORD=hunter2 access_token=t0k3n", "t0k3n", "credential-assignment"),
    (f"Authorization: Bearer {BEARER}", BEARER, "bearer-token"),
    ("curl -H 'Authorization: bearer abcdefghijkl'", "abcdefghijkl", "bearer-token"),
    (f"send Bearer {BEARER} upstream", BEARER, "bearer-token"),
    (f"Authorization: Basic {BASIC}", BASIC, "basic-auth"),
    ("postgresql://app:pa55word@db.internal:5432/app", "pa55word", "url-credentials"),
    ("redis://:hunter2@cache:6379/0", "hunter2", "url-credentials"),
]

PROSE = [
    "The tokenizer splits text into tokens before the model sees it.",
    "Our password policy requires twelve characters and a passphrase manager.",
    "The secretary filed the secret report with the committee.",
    "Soft sk-ills matter; so does sk-learn-compatible-estimator-design.",
    "Never write your password on a sticky note, and change it every quarter.",
    "Choose a strong password: at least 12 characters, mixed case.",
    "Bearer authentication is described in RFC 6750; the bearer of a token is trusted.",
    "Set max_tokens=4096 and read the tokens: they cost money.",
    "Connect to https://example.com:8443/path?page=2 and postgresql://localhost/db.",
    "The API key rotation is handled by the platform team.",
    "Escape hatch: eyJust kidding, this is not a JWT.",
]


@pytest.mark.parametrize(("text", "secret", "kind"), POSITIVE)
def test_secret_is_replaced_by_marker(text: str, secret: str, kind: str) -> None:
    """M9: each kind of secret is absent from the redacted text and the marker takes its place."""
    out = redact(text)
    assert secret not in out
    assert REDACTED in out


@pytest.mark.parametrize(("text", "secret", "kind"), POSITIVE)
def test_find_secrets_names_the_kind(text: str, secret: str, kind: str) -> None:
    """M9: find_secrets reports the kind of each secret that redact would remove."""
    assert kind in find_secrets(text)


@pytest.mark.parametrize(("text", "secret", "kind"), POSITIVE)
def test_redaction_is_idempotent(text: str, secret: str, kind: str) -> None:
    """M9: redacting twice gives the same text as redacting once, with nothing left to find."""
    once = redact(text)
    assert redact(once) == once
    assert find_secrets(once) == []


@pytest.mark.parametrize("text", PROSE)
def test_prose_passes_unchanged(text: str) -> None:
    """M9: ordinary prose about tokens, passwords and secrets is not redacted."""
    assert redact(text) == text
    assert find_secrets(text) == []


def test_marker_is_exact() -> None:
    """M9: the marker is exactly [REDACTED], never a [REDACTED:kind] variant."""
    out = redact(f"{OPENAI} {JWT} password=hunter2")
    assert REDACTED == "[REDACTED]"
    assert out == "[REDACTED] [REDACTED] password=[REDACTED]"
    assert "[REDACTED:" not in out


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("password=hunter2", "password=[REDACTED]"),
        ("Passwd: hunter2", "Passwd: [REDACTED]"),
        ('pwd="hun ter2"', 'pwd="[REDACTED]"'),
        ('{"token": "abc", "n": 1}', '{"token": "[REDACTED]", "n": 1}'),
        ("SECRET=s3cr3t;user=bob", "SECRET=[REDACTED];user=bob"),
        ("Api_Key: k3y-v4lue", "Api_Key: [REDACTED]"),
        ('password = "a\\"b" done', 'password = "[REDACTED]" done'),
    ],
)
def test_assignment_keeps_key_name(text: str, expected: str) -> None:
    """M9: an assignment keeps its key name and quotes and loses only the value."""
    assert redact(text) == expected


def test_bearer_keeps_the_word_bearer() -> None:
    """M9: Bearer tokens are redacted but the word Bearer and the header name are kept."""
    assert redact(f"Authorization: Bearer {BEARER}") == "Authorization: Bearer [REDACTED]"
    assert redact(f"use Bearer {BEARER}.") == "use Bearer [REDACTED]."


def test_url_keeps_user_and_host() -> None:
    """M9: URL credentials lose only the password; scheme, user, host and path are kept."""
    out = redact("postgresql://user:pass@host:5432/db")
    assert out == "postgresql://user:[REDACTED]@host:5432/db"


def test_pem_block_is_redacted_whole_and_surroundings_kept() -> None:
    """M9: a multi-line PEM private key is redacted from BEGIN through END, nothing more."""
    out = redact(f"before\n{PEM}\nafter")
    assert out == f"before\n{REDACTED}\nafter"
    assert "PRIVATE KEY" not in out


def test_pem_block_without_end_line_is_still_redacted() -> None:
    """M9: a PEM private key cut off before its END line is redacted to the end of the text."""
    out = redact(f"log: -----BEGIN OPENSSH PRIVATE KEY-----\n{PEM_BODY}\n")
    assert out == f"log: {REDACTED}"
    assert PEM_BODY not in out


def test_two_pem_blocks_keep_text_between_them() -> None:
    """M9: two PEM blocks are redacted separately, leaving the text between them intact."""
    out = redact(f"{PEM}\nmiddle\n{PEM.replace('RSA ', '')}")
    assert out == f"{REDACTED}\nmiddle\n{REDACTED}"


def test_public_key_is_not_redacted() -> None:
    """M9: a PEM public key or certificate is not a secret and passes unchanged."""
    text = "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkq\n-----END PUBLIC KEY-----"
    assert redact(text) == text


def test_find_secrets_order_of_first_appearance_without_duplicates() -> None:
    """M9: find_secrets lists kinds in order of first appearance, each once."""
    text = f"{OPENAI} then {JWT} then {OPENAI_PROJ} and {AWS_ID} and {JWT}"
    assert find_secrets(text) == ["openai-key", "jwt", "aws-access-key-id"]


def test_find_secrets_empty_for_clean_text() -> None:
    """M9: find_secrets returns an empty list when there is nothing to redact."""
    assert find_secrets("") == []
    assert find_secrets("nothing to see here") == []


def test_overlapping_matches_report_the_specific_kind() -> None:
    """M9: a JWT used as a token value is reported as a jwt and redacted once."""
    assert find_secrets(f"token={JWT}") == ["jwt"]
    assert redact(f"token={JWT}") == f"token={REDACTED}"


def test_overlapping_matches_are_redacted_whole() -> None:
    """M9: a value that contains a recognised key is redacted in full, not just the key."""
    out = redact(f"password=prefix/{OPENAI}")
    assert out == f"password={REDACTED}"


def test_empty_and_secret_free_text_is_returned_as_is() -> None:
    """M9: text without secrets, including the empty string, comes back unchanged."""
    assert redact("") == ""
    assert redact("password=") == "password="
    assert redact('password=""') == 'password=""'


def test_jwt_right_after_pem_block_is_redacted() -> None:
    """M9: a JWT glued to the dashes ending a PEM block is still found and redacted."""
    out = redact(f"{PEM}{JWT}")
    assert JWT not in out
    assert find_secrets(f"{PEM}{JWT}") == ["private-key", "jwt"]


@pytest.mark.parametrize(
    "text",
    [
        f'"token": {OPENAI}',
        f"secret={PEM}-",
        "note [REDACTED] then password=[REDACTED] and [REDACTED][REDACTED]",
        '{"pwd": [REDACTED]}',
        "postgresql://u:[REDACTED]x@host",
    ],
)
def test_redaction_settles_in_one_call(text: str) -> None:
    """M9: text with markers or merged matches is fully redacted by a single call."""
    once = redact(text)
    assert redact(once) == once
    assert find_secrets(once) == []


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "text",
    [
        "sk-" * 100_000,
        "0123456789abcdef" * 20_000,
        "-eyJ" * 80_000,
        'password="' * 30_000,
        "[REDACTED] password=[REDACTED] " * 10_000,
        "sshpass " * 50_000,
        "-u a:" * 60_000,
        "machine x login " * 30_000,
    ],
)
def test_adversarial_text_is_redacted_in_linear_time(text: str) -> None:
    """M9: inputs that made a regex backtrack quadratically finish well within the timeout."""
    out = redact(text)
    assert redact(out) == out


def test_module_imports_only_the_standard_library() -> None:
    """M9: events.redact depends on nothing outside the standard library."""
    source = Path(redact_module.__file__).read_text(encoding="utf-8")
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert imported
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


_SEPARATORS = st.sampled_from([" ", "\n", "\t", "=", ":", '"', "'", ",", ";", "(", ")", "/"])
_PRINTABLE = st.text(alphabet=string.printable, max_size=60)


@settings(max_examples=300, deadline=None)
@given(
    prefix=_PRINTABLE,
    before=_SEPARATORS,
    body=st.text(alphabet=string.ascii_letters + string.digits, min_size=40, max_size=40),
    after=_SEPARATORS,
    suffix=_PRINTABLE,
)
def test_generated_openai_key_never_survives(
    prefix: str, before: str, body: str, after: str, suffix: str
) -> None:
    """M9: an sk- key of 40 alphanumerics embedded in random printable text never survives."""
    # Another copy of the body elsewhere would be a different embedding, with other neighbours.
    assume(body not in prefix and body not in suffix)
    key = f"sk-{body}"
    out = redact(f"{prefix}{before}{key}{after}{suffix}")
    assert key not in out
    assert body not in out
    assert REDACTED in out


_FRAGMENTS = st.sampled_from(
    [
        OPENAI,
        ANTHROPIC,
        AWS_ID,
        JWT,
        PEM,
        GITLAB,
        SLACK,
        f"ghp_{GITHUB_SUFFIX}",
        "password=",
        "password: ",
        '"token": ',
        "Authorization: Bearer ",
        "Bearer ",
        "postgresql://u:",
        "@host",
        REDACTED,
        "hunter2",
        '"',
        "'",
        "\n",
        " ",
        "sk-",
        "-----BEGIN PRIVATE KEY-----",
    ]
)


@settings(max_examples=500, deadline=None)
@given(st.lists(_FRAGMENTS | st.text(alphabet=string.printable, max_size=8), max_size=12))
def test_redaction_is_idempotent_on_mixed_text(pieces: list[str]) -> None:
    """M9: on any mix of secrets, markers and noise, redact is idempotent and leaves no secret."""
    once = redact("".join(pieces))
    assert redact(once) == once
    assert find_secrets(once) == []


_CASED_FRAGMENTS = _FRAGMENTS.flatmap(
    lambda f: st.sampled_from([f, f.lower(), f.upper(), f.swapcase()])
)
_RULE_LITERALS = st.sampled_from(sorted({n for rule in _RULES for n in rule.needs}))


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        _CASED_FRAGMENTS
        | _RULE_LITERALS.flatmap(lambda n: st.sampled_from([n, n.upper(), n.title()]))
        | st.text(alphabet=string.printable + "\u017f\u212a\u0130\u0131", max_size=8),
        max_size=12,
    )
)
def test_skipping_rules_that_cannot_match_changes_nothing(pieces: list[str]) -> None:
    """M9: the literal prefilter only skips rules that would have found nothing."""
    text = "".join(pieces)
    assert _scan(text) == _scan(text, prefilter=False)


def test_rules_are_skipped_only_on_ascii_text() -> None:
    """M9: a long s matches "s" case-insensitively, so non-ASCII text runs every rule."""
    long_s = "pa\u017fsword"  # no "pass" in it, yet the password rule matches it
    assert redact(f"{long_s}=hunter2") == f"{long_s}={REDACTED}"
    assert redact("the api listens on port 8080") == "the api listens on port 8080"


def _corpus_scores() -> tuple[int, float, int, float]:
    """Return (secrets, recall, look-alikes, false-positive rate) of redact on the corpus."""
    total = caught = 0
    for _kind, text, secrets in SECRETS:
        out = redact(text)
        for secret in secrets:
            total += 1
            caught += secret not in out
    changed = sum(redact(text) != text for text in LOOK_ALIKES)
    return total, caught / total, len(LOOK_ALIKES), changed / len(LOOK_ALIKES)


def test_corpus_recall_and_false_positives() -> None:
    """M9: on a realistic corpus, recall is at least 0.97 and false positives at most 0.03."""
    total, recall, looks, false_positives = _corpus_scores()
    print(
        f"redaction corpus: {total} secrets, recall {recall:.3f}; "
        f"{looks} look-alikes, false positives {false_positives:.3f}"
    )
    assert total >= 150
    assert looks >= 100
    assert recall >= 0.97
    assert false_positives <= 0.03


@pytest.mark.parametrize(("kind", "text", "secrets"), SECRETS, ids=[c[0] for c in SECRETS])
def test_corpus_secret_is_gone(kind: str, text: str, secrets: tuple[str, ...]) -> None:
    """M9: each secret of the corpus, in its context, is absent after redaction."""
    out = redact(text)
    assert [s for s in secrets if s in out] == []
    assert redact(out) == out


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("DB_PASSWORD=${DB_PASSWORD}", "DB_PASSWORD=${DB_PASSWORD}"),
        ("password = os.environ['DB_PASSWORD']", "password = os.environ['DB_PASSWORD']"),
        ("password = getpass()", "password = getpass()"),
        ("PGPASSWORD=hunter2! psql", "PGPASSWORD=[REDACTED] psql"),
        ("--password hunter2!", "--password [REDACTED]"),
        ('const dbPassword = "hunter2";', 'const dbPassword = "[REDACTED]";'),
        ("accessToken: 'a1b2c3d4'", "accessToken: '[REDACTED]'"),
        (
            "AccountName=acme;AccountKey=abc/def+ghi==;x=1",
            "AccountName=acme;AccountKey=[REDACTED];x=1",
        ),
        ('{"auth": "Ym9iOmh1bnRlcjI="}', '{"auth": "[REDACTED]"}'),
    ],
)
def test_assignments_and_placeholders(text: str, expected: str) -> None:
    """M9: placeholders are kept; camelCase, PG-prefixed, option and Azure secrets are not."""
    assert redact(text) == expected


def test_sts_json_loses_every_credential() -> None:
    """M9: AWS STS JSON loses its key id, its SecretAccessKey and its SessionToken."""
    text = (
        '{"AccessKeyId": "' + AWS_SESSION_ID + '", "SecretAccessKey": "' + AWS_SECRET + '", '
        '"SessionToken": "' + "FwoGZXIvYXdzE" * 8 + '", "Expiration": "2026-11-30T12:00:00Z"}'
    )
    out = redact(text)
    assert AWS_SESSION_ID not in out
    assert AWS_SECRET not in out
    assert "FwoGZXIvYXdzE" not in out
    assert '"Expiration": "2026-11-30T12:00:00Z"' in out
