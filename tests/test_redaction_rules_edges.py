"""Redaction rules at the shapes they used to miss (M9; ADR 0018, 0019, 0068): JSON inside a
JSON string, prefixed names before a colon and a quoted value, no-break spaces, containers and
name/value pairs under a name of a secret, argv lists, keys that redact alike, keys made of items
(tuples, frozensets), XML configuration, and ordinary text that lost words it did not need to.

Each probe failed before its rule was changed; the tests after it pin the edges of each change.
Fake secrets are assembled at run time so that no literal here looks like a live credential.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_redaction_attack import _json, _stored

import journaled
from journaled import Plan, Step
from journaled.events.redact import REDACTED, find_secrets, redact, redact_data
from journaled.testing import ManualClock


def _github(tag: str) -> str:
    """Return a fake GitHub token (``ghp_`` and 36 letters and digits) marked by ``tag``."""
    return "ghp_" + (tag + "R4nd0mT0k3n" * 4)[:36]


GITHUB = _github("Rul3s")
PASSWORD = "Hunt3r-" + "Xy9" * 3
BASIC = base64.b64encode(f"bob:{PASSWORD}".encode()).decode()


def _everywhere(rt: journaled.Runtime, url: str) -> bytes:
    """Return what the journal shows (every event as JSON) and what its backend stores."""
    return _json(rt.journal.read()).encode() + b"\x00" + _stored(url)


# -- JSON inside a JSON string ---------------------------------------------------------------------


def test_json_encoded_inside_a_json_string_keeps_its_password(
    sqlite_url: str, clock: ManualClock
) -> None:
    """M9, ADR 0068: a JSON document carried as a string inside JSON (an API Gateway event's
    ``body``, a queue message, a log line that ``json.dumps`` an already-encoded payload) has its
    quotes escaped: ``{\\"password\\": \\"...\\"}``. The quoted-key rule wanted a bare quote
    right before the name and right after it, so neither the password nor the API key was
    redacted, though the same document one level down lost both. Now a backslash-escaped quote
    is accepted around a key name and its value (``\\"`` as well as ``"``)."""
    body = json.dumps({"user": "bob", "password": PASSWORD, "api_key": GITHUB[4:]})
    event = json.dumps({"event": {"httpMethod": "POST", "body": body}})
    assert PASSWORD not in redact(body)  # one level deep: redacted
    with journaled.open(sqlite_url, clock=clock) as rt:
        fact = rt.memory.remember(event)
        assert PASSWORD not in fact.text
        assert GITHUB[4:] not in fact.text
        assert PASSWORD.encode() not in _everywhere(rt, sqlite_url)


def test_an_escaped_value_is_redacted_whole_and_the_document_still_parses() -> None:
    """M9, ADR 0068: inside an escaped value ``\\\\\\"`` is a quote of the inner text and
    ``\\\\\\\\`` a backslash, so a password holding either is redacted whole, nothing around it
    is taken, and both levels of the document still decode; an empty value stays empty."""
    inner = {"user": "bob", "password": 'pa"ss\\' + PASSWORD, "empty_token": ""}
    event = json.dumps({"body": json.dumps(inner)})
    out = redact(event)
    assert json.loads(json.loads(out)["body"]) == {
        "user": "bob",
        "password": REDACTED,
        "empty_token": "",
    }
    assert redact(out) == out
    assert find_secrets(out) == []


# Characters that make escaping hard (quotes, backslashes, control characters, non-ASCII), and
# none that makes a placeholder (a call's parenthesis, a dollar); the password starts with a
# letter, so it is not a file's path either.
_AWKWARD = st.text(alphabet="\"\\\n\t'/ :,{}[]-_\u00e9\u20acaZ09", max_size=12)


@settings(max_examples=300, deadline=None)
@given(password=_AWKWARD, other=_AWKWARD, depth=st.integers(0, 4), ascii_only=st.booleans())
def test_a_password_is_redacted_at_any_depth_of_json_inside_json(
    password: str, other: str, depth: int, ascii_only: bool
) -> None:
    """M9, ADR 0068: JSON encoded into a JSON string up to four times over, with quotes,
    backslashes and control characters in its values, loses its password at every depth;
    every level still decodes, the other fields come back as they were, and a second pass
    changes nothing."""
    document = {"user": other, "password": f"Q{password}", "n": 1}
    text = json.dumps(document, ensure_ascii=ascii_only)
    for _ in range(depth):
        text = json.dumps({"body": text}, ensure_ascii=ascii_only)
    out = redact(text)
    decoded = out
    for _ in range(depth):
        decoded = json.loads(decoded)["body"]
    assert json.loads(decoded) == {"user": redact(other), "password": REDACTED, "n": 1}
    assert redact(out) == out


@pytest.mark.parametrize(
    ("inner", "secret"),
    [
        ({"cmd": f'export DB_PASSWORD="{PASSWORD}"'}, PASSWORD),
        ({"auths": {"ghcr.io": {"auth": BASIC}}}, BASIC),
        ({"Authorization": f"Bearer {PASSWORD}"}, PASSWORD),
    ],
    ids=["equals-escaped-value", "docker-auth", "bearer"],
)
def test_other_rules_read_json_inside_a_json_string_too(inner: dict[str, Any], secret: str) -> None:
    """M9, ADR 0068: every rule with a quoted value reads escaped quotes: ``PASSWORD="..."``
    in a command carried in an encoded body, and docker's ``\\"auth\\": \\"...\\"``; a
    bearer token, which needs no quotes, is redacted too."""
    out = redact(json.dumps({"body": json.dumps(inner)}))
    assert secret not in out
    assert REDACTED in out
    assert redact(out) == out


# -- a prefixed name before a colon and a quoted value ---------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "const cfg = { user: 'bob', accessToken: '{pw}' };",
        'INFO loaded clientSecret: "{pw}" from the vault',
        '{{user: "bob", dbPassword: "{pw}"}}',
    ],
)
def test_a_prefixed_name_mid_line_with_a_colon_and_a_quoted_value_keeps_its_secret(
    sqlite_url: str, clock: ManualClock, text: str
) -> None:
    """M9, ADR 0068: names with a prefix (``accessToken``, ``clientSecret``, ``dbPassword``)
    were caught after ``=``, after a quote, or at a line's start, but not mid-line before
    ``:``: the colon rule wanted no letter right before the bare name, which the prefix's last
    letter is. A JavaScript object literal or a log line holding ``accessToken: '...'`` kept
    the token, although ``token: '...'`` in the same place was redacted. Now, before a quoted
    value, the name may carry any prefix, as after ``=``."""
    text = text.replace("{pw}", PASSWORD).replace("{{", "{").replace("}}", "}")
    with journaled.open(sqlite_url, clock=clock) as rt:
        fact = rt.memory.remember(text)
        assert PASSWORD not in fact.text
        assert PASSWORD.encode() not in _everywhere(rt, sqlite_url)


@pytest.mark.parametrize(
    "text",
    [
        "Tokens: 'four thousand'",
        "the tokenizer: 'bpe'",
        'clientSecret: "${CLIENT_SECRET}"',
        "accessToken: '<token>'",
        "set maxTokens: 512 and the secretary: 'Bob'",
        "then the accessToken: expired, so we asked again",
    ],
)
def test_a_quoted_word_after_a_longer_word_or_a_placeholder_is_kept(text: str) -> None:
    """M9, ADR 0068: only a name that ends where the colon is names a secret (``Tokens``,
    ``tokenizer``, ``secretary`` do not), a placeholder is kept, and an unquoted word after a
    prefixed name mid-line is left to prose as before."""
    assert redact(text) == text


# -- horizontal whitespace that is not a space or a tab --------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "password\u00a0=\u00a0{pw}",
        "password:\u00a0{pw}",
        "Authorization: Bearer\u00a0{token}",
        "DB_PASSWORD =\u3000{pw}",
    ],
    ids=["nbsp-equals", "nbsp-colon", "nbsp-bearer", "ideographic-space"],
)
def test_a_non_breaking_space_in_an_assignment_hides_the_secret(
    sqlite_url: str, clock: ManualClock, text: str
) -> None:
    """M9, ADR 0068: the assignment and bearer rules allowed only ASCII spaces and tabs around
    ``=``/``:`` and after ``Bearer``. Text pasted from a web page, a chat or a word processor
    often has a no-break space (U+00A0) there, and CJK input an ideographic space (U+3000):
    ``password = hunter2`` written so is still an assignment to a reader, but it was stored as
    it was. Now any horizontal whitespace is accepted where a space or a tab was."""
    text = text.format(pw=PASSWORD, token="Ab9" * 8)
    with journaled.open(sqlite_url, clock=clock) as rt:
        fact = rt.memory.remember(text)
        assert REDACTED in fact.text, fact.text
        assert PASSWORD.encode() not in _everywhere(rt, sqlite_url)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sshpass\u00a0-p\u00a0{pw} ssh web-1", f"sshpass\u00a0-p\u00a0{REDACTED} ssh web-1"),
        ("--password\u2009{pw}", f"--password\u2009{REDACTED}"),
        ("Authorization:\u00a0Basic\u00a0{basic}", f"Authorization:\u00a0Basic\u00a0{REDACTED}"),
        ('"token"\u00a0:\u00a0"{pw}"', f'"token"\u00a0:\u00a0"{REDACTED}"'),
        ("password:\n{pw}", "password:\n{pw}"),
    ],
    ids=["sshpass", "thin-space-option", "basic", "json", "no-line-break"],
)
def test_other_rules_take_any_horizontal_whitespace_but_not_a_line_break(
    text: str, expected: str
) -> None:
    """M9, ADR 0068: the command, option, basic-auth and JSON rules take a no-break or thin
    space as they take a space; a line break still ends an assignment."""
    text = text.format(pw=PASSWORD, basic=BASIC)
    assert redact(text) == expected.format(pw=PASSWORD)


# -- containers and pairs under a name of a secret -------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        {"password": ["{pw}"]},
        {"client_secret": {"value": "{pw}", "version": 3}},
        {"credentials": ["bob", "{pw}"]},
    ],
    ids=["list-under-password", "dict-under-client-secret", "list-under-credentials"],
)
def test_a_container_under_a_key_naming_a_secret_keeps_its_secret(
    sqlite_url: str, clock: ManualClock, data: dict[str, Any]
) -> None:
    """M9, ADR 0068: ``redact_data`` replaced a *scalar* under a key naming a secret; a list or
    dict under it was walked like any other, so its plain strings (no token shape, no
    ``password=`` of their own) were kept. ``{"password": "x"}`` lost x but
    ``{"password": ["x"]}`` kept it, and so did a secret manager's
    ``{"client_secret": {"value": "x"}}``. Now, under a key naming a secret, every scalar leaf
    is replaced (placeholders kept), however deep."""
    data = json.loads(json.dumps(data).replace("{pw}", PASSWORD))
    assert redact_data(dict.fromkeys(data, PASSWORD)) == dict.fromkeys(data, REDACTED)
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("echo", lambda value: value)
        result = rt.execute(Plan(goal="g", steps=[Step("a", tool="echo", input=data)]))
        assert PASSWORD not in _json(result)
        assert PASSWORD.encode() not in _everywhere(rt, sqlite_url)


def test_under_a_name_of_a_secret_placeholders_none_and_booleans_are_kept() -> None:
    """M9, ADR 0068: deep under a name of a secret, strings and numbers go, keys stay (redacted
    as text), and what says nothing is kept: placeholders, empty strings, None, booleans."""
    data = {
        "auth": {
            "basic": [["bob", PASSWORD]],
            "ttl": 3600,
            "from": "${DB_PASSWORD}",
            "empty": "",
            "rotate": True,
            "note": None,
            GITHUB: "owner",
        },
        "region": "eu-west-1",
    }
    out = redact_data(data)
    assert out == {
        "auth": {
            "basic": [[REDACTED, REDACTED]],
            "ttl": REDACTED,
            "from": "${DB_PASSWORD}",
            "empty": "",
            "rotate": True,
            "note": None,
            REDACTED: REDACTED,
        },
        "region": "eu-west-1",
    }
    assert redact_data(out) == out


@pytest.mark.parametrize(
    "data",
    [
        {"env": [{"name": "DB_PASSWORD", "value": "{pw}"}]},
        {"headers": [{"name": "Authorization", "value": "Basic {basic}"}]},
        {"headers": [["Authorization", "Basic {basic}"]]},
    ],
    ids=["kubernetes-env", "har-header", "header-pairs"],
)
def test_a_name_value_pair_naming_a_secret_keeps_its_value(
    sqlite_url: str, clock: ManualClock, data: dict[str, Any]
) -> None:
    """M9, ADR 0068: ``{"DB_PASSWORD": x}`` lost x, but the same assignment in the shapes
    that APIs use for ordered or repeated names kept it: a Kubernetes container's ``env``
    (``{"name": "DB_PASSWORD", "value": x}``), a HAR or fetch header list
    (``{"name": "Authorization", "value": "Basic ..."}``) and header pairs
    (``[["Authorization", "Basic ..."]]``, as httpx and ASGI give them): ``redact_data`` looked
    only at the key a value sat under. Now a ``name``/``value`` (or ``key``/``value``) mapping
    and a pair whose first item names a secret are assignments of that name."""
    data = json.loads(json.dumps(data).replace("{pw}", PASSWORD).replace("{basic}", BASIC))
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("echo", lambda value: value)
        result = rt.execute(Plan(goal="g", steps=[Step("a", tool="echo", input=data)]))
        shown = _json(result)
        stored = _everywhere(rt, sqlite_url)
    assert PASSWORD not in shown
    assert BASIC not in shown
    assert PASSWORD.encode() not in stored
    assert BASIC.encode() not in stored


def test_only_the_value_of_a_pair_naming_a_secret_goes() -> None:
    """M9, ADR 0068: the name of a pair and of a name/value mapping is kept, and so are
    entries whose name is no secret's, a reference that holds no value (``valueFrom``), a
    placeholder value, and AWS-style ``Key``/``Value`` fields are read whatever their case."""
    data = {
        "env": [
            {"name": "DB_PASSWORD", "value": PASSWORD},
            {"name": "DB_HOST", "value": "db.internal"},
            {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "t"}}},
            {"name": "GITHUB_TOKEN", "value": "${GITHUB_TOKEN}"},
        ],
        "Tags": [{"Key": "ServiceToken", "Value": PASSWORD}, {"Key": "team", "Value": "ops"}],
        "headers": [("Authorization", f"Basic {BASIC}"), ("Accept", "application/json")],
    }
    out = redact_data(data)
    assert out == {
        "env": [
            {"name": "DB_PASSWORD", "value": REDACTED},
            {"name": "DB_HOST", "value": "db.internal"},
            {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "t"}}},
            {"name": "GITHUB_TOKEN", "value": "${GITHUB_TOKEN}"},
        ],
        "Tags": [{"Key": "ServiceToken", "Value": REDACTED}, {"Key": "team", "Value": "ops"}],
        "headers": [("Authorization", REDACTED), ("Accept", "application/json")],
    }
    assert redact_data(out) == out


# -- argv lists ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["sshpass", "-p", "{pw}", "ssh", "deploy@web-1"],
        ["curl", "-u", "bob:{pw}", "https://api.example.com/v1/me"],
        ["mysqldump", "-uroot", "-p{pw}", "shop"],
        ["vault", "login", "--token", "{pw}"],
    ],
    ids=["sshpass", "curl-user", "mysql-p", "vault-token"],
)
def test_a_command_line_split_into_an_argv_list_keeps_its_password(
    sqlite_url: str, clock: ManualClock, argv: list[str]
) -> None:
    """M9, ADR 0068: the command-line rules (``command-password``, ``--token X``) see one
    string at a time, so the same command that a shell history line loses its password in kept
    it when a tool took it as an argv list (``subprocess.run([...])``, the usual shape of a
    shell tool's input): the password is an item of its own, with nothing around it to match.
    Now ``redact_data`` also redacts a list of strings as the command line it spells (the items
    joined by spaces), redacting each item a hit lies within."""
    argv = [a.replace("{pw}", PASSWORD) for a in argv]
    assert PASSWORD not in redact(" ".join(argv))  # the same command as one line: redacted
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("shell", lambda value: {"ran": value["argv"], "status": 0})
        plan = Plan(goal="g", steps=[Step("a", tool="shell", input={"argv": argv})])
        result = rt.execute(plan)
        assert PASSWORD not in _json(result)
        assert PASSWORD.encode() not in _everywhere(rt, sqlite_url)


def test_an_argv_item_loses_only_its_secret_and_the_next_item_is_not_taken() -> None:
    """M9, ADR 0068: in an argv list only the part of an item a hit covers becomes the marker
    (``bob:[REDACTED]``, ``-p[REDACTED]``), tuples stay tuples, and a value that runs to the
    end of the joined line does not take the items after it."""
    assert redact_data(("mysql", "-uroot", f"-p{PASSWORD}", "shop")) == (
        "mysql",
        "-uroot",
        f"-p{REDACTED}",
        "shop",
    )
    assert redact_data(["curl", "-u", f"bob:{PASSWORD}", "https://x.example.com"]) == [
        "curl",
        "-u",
        f"bob:{REDACTED}",
        "https://x.example.com",
    ]
    lines = ["password: hunter2 now", "next line", "token:", PASSWORD]
    out = redact_data({"lines": lines})
    assert out == {"lines": [f"password: {REDACTED}", "next line", "token:", REDACTED]}
    assert redact_data(out) == out
    assert redact_data(["git", "commit", "-m", "fix the token rotation"]) == [
        "git",
        "commit",
        "-m",
        "fix the token rotation",
    ]


# -- keys that redact alike ------------------------------------------------------------------------


def test_two_keys_that_redact_alike_lose_one_entry(sqlite_url: str, clock: ManualClock) -> None:
    """M9, ADR 0068: ``redact_data`` redacts dict keys (a map from tokens to their owners) and
    wrote each entry under its redacted key, so two tokens that both became ``[REDACTED]``
    collided and the first entry was silently overwritten: a tool's
    ``{token_a: "alice", token_b: "bob"}`` came back (live and from the journal) as
    ``{"[REDACTED]": "bob"}`` and alice was gone, though she was no secret. Now keys that
    collide after redaction are numbered (``[REDACTED]``, ``[REDACTED] 2``)."""
    owners = {_github("Al1ce"): "alice", _github("B0bby"): "bob"}
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("owners", lambda data: owners)
        result = rt.execute(Plan(goal="g", steps=[Step("a", tool="owners")]))
    output = result.observations[0].output
    assert sorted(output.values()) == ["alice", "bob"], output


def test_colliding_keys_are_numbered_in_order_whatever_they_hold() -> None:
    """M9, ADR 0068: the numbers follow the entries' order and skip a key the data already
    has; a colliding key whose value is a container keeps its place; a second pass changes
    nothing."""
    data = {
        _github("Al1ce"): {"role": "admin"},
        "[REDACTED] 2": "taken",
        _github("B0bby"): ["x", "y"],
        f"password={PASSWORD}": 3,
    }
    out = redact_data(data)
    assert list(out.items()) == [
        (REDACTED, {"role": "admin"}),
        (f"{REDACTED} 2", "taken"),
        (f"{REDACTED} 3", ["x", "y"]),
        (f"password={REDACTED}", 3),
    ]
    assert redact_data(out) == out


@pytest.mark.parametrize(
    "output",
    [{("alice", f"token {GITHUB}"): "ok"}, {frozenset({f"token {GITHUB}"}): 1}],
    ids=["tuple-key", "frozenset-key"],
)
def test_a_secret_inside_a_tuple_or_frozenset_key_is_never_journaled(
    sqlite_url: str, clock: ManualClock, output: dict[Any, Any]
) -> None:
    """M9, ADR 0018, 0068, 0098: a tool's output keyed by ``(user, token)`` (or a frozenset,
    journaled as a tuple) was journaled and returned with the token. Such a key is now refused
    (its step fails naming the key's path, not its items), so the token is stored nowhere and
    said in no error; ``redact_data`` still redacts such a key where it meets one."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        rt.register_tool("creds", lambda data: output)
        result = rt.execute(Plan(goal="g", steps=[Step("a", tool="creds")]))
        assert not result.ok
        live = result.observations[0]
        replayed = rt.runs.at(result.run_id, rt.journal.position()).observations[0]
        stored = _everywhere(rt, sqlite_url)
    assert GITHUB.encode() not in stored
    assert GITHUB not in repr(live)
    assert live == replayed
    assert "a key at $ is a tuple, not a str" in (live.error or "")


def test_tuple_and_frozenset_keys_that_redact_alike_are_numbered_and_keep_their_type() -> None:
    """M9, ADR 0068: two composite keys that redact alike keep both entries; the number is a
    further item of the key, in the entries' order, skipping a key the data already has. An
    item that names a secret hides the next one as in a value's pair; a second pass changes
    nothing."""
    data = {
        ("alice", _github("Al1ce")): "a",
        ("alice", REDACTED, 2): "taken",
        ("alice", _github("B0bby")): "b",
        frozenset({_github("Al1ce")}): 1,
        frozenset({_github("B0bby")}): 2,
        ("password", PASSWORD): 3,
        ("ops", ("deploy", frozenset({f"token {GITHUB}"}))): 4,
    }
    out = redact_data(data)
    assert list(out.items()) == [
        (("alice", REDACTED), "a"),
        (("alice", REDACTED, 2), "taken"),
        (("alice", REDACTED, 3), "b"),
        (frozenset({REDACTED}), 1),
        (frozenset({REDACTED, 2}), 2),
        (("password", REDACTED), 3),
        (("ops", ("deploy", frozenset({f"token {REDACTED}"}))), 4),
    ]
    assert redact_data(out) == out


# -- XML configuration -----------------------------------------------------------------------------

_XML_SHAPES = {
    "maven-settings": (
        f"<server><id>nexus</id><username>deploy</username><password>{PASSWORD}</password>"
        "</server>",
        f"<server><id>nexus</id><username>deploy</username><password>{REDACTED}</password>"
        "</server>",
    ),
    "camel-case-tag": (f"<apiToken>{PASSWORD}</apiToken>", f"<apiToken>{REDACTED}</apiToken>"),
    "namespace-indented": (
        f'<ns:clientSecret id="1">\n  {PASSWORD}\n</ns:clientSecret>',
        f'<ns:clientSecret id="1">{REDACTED}</ns:clientSecret>',
    ),
    "cdata": (
        f"<password><![CDATA[{PASSWORD}]]></password>",
        f"<password><![CDATA[{REDACTED}]]></password>",
    ),
    "dotnet-add-key": (
        f'<appSettings><add key="DbPassword" value="{PASSWORD}"/></appSettings>',
        f'<appSettings><add key="DbPassword" value="{REDACTED}"/></appSettings>',
    ),
    "spring-property": (
        f"<property name='spring.datasource.password' value='{PASSWORD}' />",
        f"<property name='spring.datasource.password' value='{REDACTED}' />",
    ),
    "value-first": (
        f'<property value="{PASSWORD}" name="password"/>',
        f'<property value="{REDACTED}" name="password"/>',
    ),
    "java-properties-entry": (
        f'<entry key="db.password">{PASSWORD}</entry>',
        f'<entry key="db.password">{REDACTED}</entry>',
    ),
    "nested-value": (
        f'<property name="apiKey">\n  <value>{PASSWORD}</value>\n</property>',
        f'<property name="apiKey">\n  <value>{REDACTED}</value>\n</property>',
    ),
    "inside-a-json-string": (
        json.dumps({"config": f'<add key="ApiToken" value="{PASSWORD}" />'}),
        json.dumps({"config": f'<add key="ApiToken" value="{REDACTED}" />'}),
    ),
}


@pytest.mark.parametrize(("text", "expected"), _XML_SHAPES.values(), ids=_XML_SHAPES.keys())
def test_a_secret_in_xml_configuration_is_redacted(text: str, expected: str) -> None:
    """M9, ADR 0068: the assignment rules knew ``=``, ``:``, JSON, argv and name/value data, so
    XML configuration kept its secrets: Maven's ``<password>x</password>``, .NET's ``<add
    key="DbPassword" value="x"/>``, Spring's and Ant's ``<property name="password"
    value="x"/>``. Now the text of an element named after a secret, and the value (or text) of
    an element whose ``key`` or ``name`` names one, are redacted; tags and attributes stay, and
    a second pass changes nothing."""
    out = redact(text)
    assert out == expected
    assert find_secrets(text) == ["credential-assignment"]
    assert redact(out) == out


def test_a_remembered_maven_password_never_reaches_the_journal(
    sqlite_url: str, clock: ManualClock
) -> None:
    """M9, ADR 0068: a fact quoting a Maven ``settings.xml`` server was journaled with its
    password."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        fact = rt.memory.remember("maven settings: " + _XML_SHAPES["maven-settings"][0])
        assert PASSWORD not in fact.text
        stored = _everywhere(rt, sqlite_url)
    assert PASSWORD.encode() not in stored


@pytest.mark.parametrize(
    "text",
    [
        "<page><name>password reset page</name><title>Forgot your token?</title></page>",
        "<passwordPolicy>min-length-12</passwordPolicy><tokenTtl>3600</tokenTtl>",
        '<property name="passwordLength" value="12"/><add key="TokenTtl" value="3600" />',
        '<add key="password" /><add key="Mode" value="strict-2" />',
        "<password>${env.NEXUS_PASSWORD}</password>",
        '<property name="password" value="${db.password}"/>',
        "<password>\n  \n</password><password/>",
        "<token>a1</b> and <secret>x2</secrets>",
    ],
    ids=[
        "text-about",
        "longer-tags",
        "longer-names",
        "no-value",
        "maven-placeholder",
        "spring-placeholder",
        "blank",
        "unclosed",
    ],
)
def test_ordinary_xml_is_kept(text: str) -> None:
    """M9, ADR 0068: XML that only talks about secrets keeps its text: an element that merely
    holds the word (``<name>password reset page</name>``), tags and names that start with a
    secret's name (``<passwordPolicy>``, ``name="passwordLength"``), an element with no value,
    a placeholder (``${db.password}``), blank text, and tags that do not close each other."""
    assert redact(text) == text


# -- ordinary text ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "docker run -u 1000:1000 -v /data:/data ubuntu id",
        "docker exec --user www-data:www-data app ls /var/www",
        "read https://news.example.com/markets/sk-hynix-q3-2024-earnings-beat-estimates",
        "gpt-4o-mini costs less: price per token: $0.00015 in, $0.0006 out",
        "sort -u names:list > out.txt",
    ],
    ids=["docker-uid-gid", "docker-user-group", "sk-hynix-slug", "price-per-token", "sort-u"],
)
def test_ordinary_text_loses_words_it_did_not_need_to(
    sqlite_url: str, clock: ManualClock, text: str
) -> None:
    """M9, ADR 0068 (ADR 0019: false positives ≤ 0.03 on look-alikes): some everyday run data
    was redacted though it held no secret. ``-u``/``--user`` followed by ``x:y`` was read as
    curl's ``user:password``, so ``docker run -u 1000:1000`` lost its group id and
    ``--user www-data:www-data`` its group; a URL slug about SK hynix (``sk-`` then 20
    characters with a digit) was taken for an OpenAI key; ``price per token: $0.00015`` lost
    the price, the very figure an agent's cost report is about. Now the user part of ``-u`` is
    read only after ``curl``, an ``sk-`` body made of lower-case words and numbers is prose,
    and an amount of money is kept after ``token:``."""
    with journaled.open(sqlite_url, clock=clock) as rt:
        fact = rt.memory.remember(text)
    assert fact.text == text


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (f"curl -s https://api.example.com -u bob:{PASSWORD}", PASSWORD),
        (f"curl --user=bob:{PASSWORD} https://api.example.com", PASSWORD),
        (f"curl -ubob:{PASSWORD} https://api.example.com", PASSWORD),
        ("use sk-lf-123e4567-e89b-12d3-a456-426614174000 here", "123e4567-e89b"),
        ("sk-" + "a1b2c3d4e5f6g7h8i9j0", "a1b2c3d4e5f6g7h8i9j0"),
        (f"the ci token: ${PASSWORD} expires", PASSWORD),
        ("the pin token: 12345678 then", "12345678"),
    ],
    ids=["curl-user", "curl-user-equals", "curl-glued", "uuid-key", "lower-key", "dollar", "pin"],
)
def test_what_the_false_positive_fixes_still_redact(text: str, secret: str) -> None:
    """M9, ADR 0068: curl's ``-u``, ``--user=`` and glued ``-u`` still lose the password; an
    ``sk-`` key of hex groups or one long lower-case run is still a key; after ``token:`` a
    value that is not an amount (a ``$`` before letters, a bare number) still goes."""
    out = redact(text)
    assert secret not in out
    assert redact(out) == out


# -- cost ------------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "piece",
    [
        '\\"password\\": \\"',
        '\\"password\\": \\"a\\\\',
        "accessToken: '",
        "password\u00a0=\u00a0",
        "Authorization:\u00a0Bearer\u00a0",
        "curl -u a:",
        "curl ",
        "sk-hynix-q3-",
        "token: $0.",
        "xsk-ant-",
        "xghp_" + "a1" * 18,
        "aglpat-",
        "<password>",
        "<a.password ",
        "<password>a ",
        'key="password" ',
        'name="password" value="',
        'name="password">',
        'value="x" password ',
        "<token><![CDATA[",
    ],
)
def test_a_mebibyte_of_adversarial_text_is_redacted_in_linear_time(piece: str) -> None:
    """M9, ADR 0068: a mebibyte repeating what the changed rules start on (escaped quotes, a
    prefixed name, no-break spaces, curl, slugs, amounts, XML elements and attributes) is
    redacted in a few seconds, and a second pass changes nothing."""
    text = (piece * ((1 << 20) // len(piece) + 1))[: 1 << 20]
    began = time.monotonic()
    out = redact(text)
    assert time.monotonic() - began < 15
    assert redact(out) == out


@pytest.mark.timeout(60)
def test_large_structured_data_in_the_new_shapes_is_redacted_in_linear_time() -> None:
    """M9, ADR 0068: long argv lists, many colliding keys (strings or tuples), many pairs and
    deep containers under a name of a secret are redacted in a few seconds, and a second pass
    changes nothing."""
    data = {
        "argv": ["sshpass", "-p", "pw"] * 20_000,
        "keys": {_github(f"{i:06d}"): i for i in range(20_000)},
        "tuple keys": {("u", _github(f"{i:06d}")): i for i in range(20_000)},
        "pairs": [["Authorization", "Basic abc"]] * 20_000,
        "env": [{"name": "DB_PASSWORD", "value": "x"}] * 20_000,
        "password": [[["x"] * 10] * 10] * 200,
    }
    began = time.monotonic()
    out = redact_data(data)
    assert time.monotonic() - began < 15
    assert len(out["keys"]) == 20_000
    assert len(out["tuple keys"]) == 20_000
    assert redact_data(out) == out


_NEW_FRAGMENTS = st.sampled_from(
    [
        '\\"password\\": \\"',
        '\\\\\\"token\\\\\\": \\\\\\"',
        '\\"',
        "\\\\",
        '"',
        "accessToken: '",
        "'",
        "password\u00a0=\u00a0",
        "Bearer\u3000",
        "curl -u bob:",
        "docker run -u 1000:",
        "sk-hynix-q3-2024-earnings-",
        "token: $0.5",
        REDACTED,
        PASSWORD,
        GITHUB,
        " ",
        "\n",
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_NEW_FRAGMENTS | st.text(max_size=6), max_size=12))
def test_redaction_is_idempotent_on_text_mixing_the_new_shapes(pieces: list[str]) -> None:
    """M9, ADR 0068: on any mix of escaped quotes, prefixed names, no-break spaces, curl and
    docker options, slugs, amounts, markers and secrets, a second pass changes nothing, and
    the same pieces as an argv list are redacted idempotently too."""
    once = redact("".join(pieces))
    assert redact(once) == once
    assert find_secrets(once) == []
    argv = redact_data(pieces)
    assert redact_data(argv) == argv


# -- tokens glued to the word before them ----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (f"mytoken{GITHUB} for the ci", "github-token"),
        ("tok" + "github_pat_" + "11ABCDEFG0" * 3, "github-token"),
        ("keysk-ant-api03-" + "Zq8" * 10, "anthropic-key"),
        ("tokenglpat-" + "Ab3-" * 6, "gitlab-token"),
        ("pwpypi-AgEIcHlwaS5vcmc" + "Yz0_" * 15, "pypi-token"),
    ],
    ids=["github-classic", "github-fine-grained", "anthropic", "gitlab", "pypi"],
)
def test_a_token_with_a_distinctive_prefix_is_redacted_when_glued_to_a_word(
    text: str, kind: str
) -> None:
    """M9, ADR 0068 update: a token whose prefix names it (a classic GitHub token by its exact
    36-character body, ``github_pat_``, ``sk-ant-``, ``glpat-``, ``pypi-AgEI...``) is redacted
    even when the word before it is glued on; the words before it stay."""
    out = redact(text)
    assert out.startswith(text[:2])
    assert REDACTED in out
    assert find_secrets(text) == [kind]
    assert redact(out) == out


@pytest.mark.parametrize(
    "text",
    [
        "xghp_" + "short1234",  # too short for a classic token's body
        "xghp_" + "a1B2c3" * 7,  # 42 characters: not a classic token's exact body
        "the task-ant-colony notes are here",  # "sk-ant-" without a key's length
        "my_ghp_" + "a1B2c3" * 7,  # glued by "_" and not a token's exact body
    ],
    ids=["short", "too-long-glued", "task-ant", "underscore-glued"],
)
def test_a_glued_lookalike_without_a_tokens_shape_is_kept(text: str) -> None:
    """M9, ADR 0068 update: without a boundary before it, only a classic GitHub token's exact
    shape counts; lookalikes too short or too long, and ``sk-ant-`` without a key's length, stay."""
    assert redact(text) == text
