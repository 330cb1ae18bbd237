"""Replace secrets in free text with a fixed marker before the text is journaled (M9).

The journal is append-only and replayed forever: a secret that reaches it cannot be taken back
by a later event, it is copied into every snapshot, export and backup, and it is shown to every
agent that replays the stream. So redaction happens on the way in, before anything is appended,
and nothing downstream ever has to be trusted with a secret. That makes this a filter that errs
towards redacting: a false positive costs a few characters of context, a false negative leaks.

What is caught, under the kind name that :func:`find_secrets` reports for it:

- ``openai-key``: ``sk-...`` API keys, including ``sk-proj-...`` and other prefixed forms (not
  a slug of lower-case words and numbers such as ``sk-hynix-q3-2024-earnings``);
- ``anthropic-key``: ``sk-ant-...`` API keys;
- ``aws-access-key-id``: ``AKIA`` or ``ASIA`` followed by 16 upper-case letters or digits;
- ``aws-secret-access-key``: the value of an ``aws_secret_access_key = ...`` assignment;
- ``github-token``: ``ghp_``, ``gho_``, ``ghu_``, ``ghs_``, ``ghr_`` and ``github_pat_`` tokens;
- ``gitlab-token``: ``glpat-`` tokens;
- ``slack-token``: ``xoxa-``, ``xoxb-``, ``xoxp-``, ``xoxo-``, ``xoxr-`` and ``xoxs-`` tokens;
- ``jwt``: three base64url segments, the first starting ``eyJ``;
- ``private-key``: a PEM ``-----BEGIN ... PRIVATE KEY-----`` block through its END line, or
  through the end of the text when the END line is missing;
- ``stripe-key``: ``sk_live_``, ``sk_test_``, ``rk_live_``, ``rk_test_`` keys and ``whsec_``
  webhook secrets;
- ``google-key``: ``AIza...`` API keys and ``ya29.`` OAuth access tokens;
- ``huggingface-token``, ``npm-token``, ``pypi-token``, ``sendgrid-key``, ``telegram-token``
  (``<bot id>:AA...``) and ``discord-token`` (three dotted segments, the first a base64 bot id);
- ``webhook-url``: the path of a Slack or Discord webhook URL;
- ``azure-sas-signature``: the ``sig=`` of a shared access signature URL;
- ``registry-auth``: docker's base64 ``"auth"`` value;
- ``credential-assignment``: the value of ``password``, ``passwd``, ``pwd``, ``passphrase``,
  ``token``, ``secret``, ``secret_key``, ``api_key`` (also ``apikey``, ``api-key``),
  ``access_key``, ``account_key`` and ``private_key`` assignments, with ``=``, or with ``:``
  (mid-sentence only when the value is not a plain word), and of command-line options such as
  ``--password X``; the name may carry any prefix (``DB_PASSWORD``, ``PGPASSWORD``,
  ``dbPassword``, ``clientSecret``, ``SessionToken``, Azure's ``AccountKey``) and is matched
  case-insensitively. A value that only says where the secret comes from (``${DB_PASSWORD}``,
  ``os.environ[...]``, ``getpass()``, ``<password>``, ``***``) is not a secret and is kept, and
  so is an amount of money after a mid-sentence colon (``price per token: $0.00015``). Quotes
  may be escaped, at any depth, as in JSON carried inside a JSON string
  (``{\\"password\\": \\"...\\"}``). The same names written as XML configuration too:
  the text of an element named after one (``<password>...</password>``, ``<apiToken>``), and
  the value of an element whose ``key`` or ``name`` attribute names one (``<add
  key="DbPassword" value="..."/>``, ``<property name="password" value="..."/>``);
- ``bearer-token``: the token after ``Authorization: Bearer`` (or ``token``, ``Bot``) or after
  a bare ``Bearer``;
- ``basic-auth``: the credentials after ``Authorization: Basic``;
- ``command-password``: ``curl -u user:password`` (after ``curl`` only: the ``-u`` of
  ``docker run`` or ``sort`` is no password), a ``.netrc`` password, and the password option of
  ``sshpass``, ``docker login``, ``redis-cli`` and ``mysql``;
- ``url-credentials``: the password in ``scheme://user:password@host``.

Where a rule allows a space it allows any horizontal whitespace (a no-break space, an
ideographic space), never a line break.

Key names, the words ``Bearer`` and ``Basic``, and the user part of a URL are kept, so the
redacted text still says what was there: ``password=hunter2`` becomes ``password=[REDACTED]``.
Redaction is idempotent, and text that was already redacted has no secrets left to find.
:func:`redact_data` applies the same rules to structured data, and reads its shapes too: what
is stored under a name of a secret, name/value pairs, argv lists, keys made of items.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["REDACTED", "find_secrets", "redact", "redact_data"]

REDACTED: str = "[REDACTED]"
"""The marker that replaces every secret."""


# A piece of a hyphenated phrase or URL slug: a lower-case word, a number, or a short mix such
# as "q3" or "v2". The pieces of a random key are longer and mix letters with digits.
_SLUG_PIECE = re.compile(r"[a-z]*|[0-9]+|[a-z0-9]{1,5}")
_SLUG_WORD = re.compile(r"[a-z]{3,}")


def _openai_body_is_key(secret: str) -> bool:
    # "sk-learn-compatible-estimators" and a slug such as "sk-hynix-q3-2024-earnings-beat" are
    # prose: lower-case words and numbers joined by hyphens, two of them words. A key has an
    # upper-case letter or an underscore, a long unbroken run, or a piece no word would make
    # (the hex groups of "sk-lf-" and a UUID).
    body = secret[3:]
    if any(c.isupper() or c == "_" for c in body):
        return True
    pieces = body.split("-")
    if any(len(piece) >= 20 for piece in pieces):
        return True
    words = sum(_SLUG_WORD.fullmatch(piece) is not None for piece in pieces)
    return words < 2 or not all(_SLUG_PIECE.fullmatch(piece) for piece in pieces)


def _bearer_token_is_credential(secret: str) -> bool:
    # "Bearer authentication" and "the bearer of this note" are prose; tokens are long and have
    # a digit or an upper-case letter past the first character.
    return len(secret) >= 8 and any(c.isdigit() or c.isupper() for c in secret[1:])


_PLACEHOLDER = re.compile(
    r"""
    \$\{?[A-Za-z_][A-Za-z0-9_]*\}? | \$\(.*   # ${DB_PASSWORD}, $PGPASS, $(cat file)
    | \$\{[A-Za-z_][A-Za-z0-9_.-]*\}          # Maven's ${env.DB_PASSWORD}, Spring's ${db.password}
    | \{\{.*\}\} | \{%.*%\} | %\([A-Za-z_]\w*\)s   # templates: {{ secrets.X }}, %(password)s
    | <[^<>]*> | \[[A-Z_ -]+\]                # <your-password>, [PASSWORD]
    | (?:os\.(?:environ|getenv)|getpass|process\.env|ENV\[|env\(|System\.getenv|secrets\.)\S*
    | [A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\(\S*   # a call: get_secret(...), getpass()
    | (?:self|cls|this|config|settings|cfg|conf|args|opts|options|env)\.[A-Za-z_][\w.]*
    | [*xX._-]{3,}                           # ***, xxxx, ..., masked values
    | (?:/|~/|\./)[\w./-]*                     # a file that holds it: /run/secrets/db
    | (?i:none|null|nil|undefined|true|false|your[_-]\S*|example|placeholder|redacted|changeit)
    """,
    re.VERBOSE,
)


def _not_placeholder(secret: str) -> bool:
    # "password: ${DB_PASSWORD}" or "token = os.environ['TOKEN']" names where a secret comes
    # from, which is worth keeping; a literal value is what leaks.
    return _PLACEHOLDER.fullmatch(secret.strip()) is None


# A price: "price per token: $0.00015" is what a cost report is about.
_AMOUNT = re.compile(
    r"[$\u00a3\u00a5\u20ac]\d[\d,]*(?:\.\d+)?|\d[\d,]*(?:\.\d+)?[$\u00a2\u00a3\u00a5\u20ac]"
)


def _looks_like_value(secret: str) -> bool:
    # "password: hunter2" mid-sentence is a leak; "password: at least" and "password: 12
    # characters" are prose, so a word of letters only, or a very short one, is left alone, and
    # so is an amount of money.
    return (
        len(secret) >= 4
        and not secret.isalpha()
        and _AMOUNT.fullmatch(secret) is None
        and _not_placeholder(secret)
    )


_MARKER = re.compile(re.escape(REDACTED))


def _marker_at(position: int, markers: list[tuple[int, int]]) -> int | None:
    """Return the index of the marker covering ``position``, if one does."""
    # Markers are disjoint and sorted, so a binary search keeps the second pass of a text full
    # of markers linear instead of markers times matches.
    index = bisect.bisect_right(markers, (position, math.inf)) - 1
    if index >= 0 and markers[index][0] <= position < markers[index][1]:
        return index
    return None


def _within_markers(start: int, end: int, markers: list[tuple[int, int]]) -> bool:
    """Return whether ``[start, end)`` lies wholly inside markers that follow one another."""
    index = _marker_at(start, markers)
    if index is None:
        return False
    position = markers[index][1]
    index += 1
    while position < end and index < len(markers) and markers[index][0] == position:
        position = markers[index][1]
        index += 1
    return position >= end


@dataclass(frozen=True, slots=True)
class _Rule:
    """One kind of secret and how to find it.

    Attributes:
        kind: The name reported by :func:`find_secrets`.
        pattern: The compiled expression.
        groups: Names of the groups holding the secret, tried in order; empty means the whole
            match is the secret.
        accept: A further check on the secret text, for shapes a regex cannot rule out cheaply.
        needs: Lower-case literals of which every match holds at least one. On ASCII text a
            rule none of whose literals occurs in the lower-cased text cannot match and is not
            run.
    """

    kind: str
    pattern: re.Pattern[str]
    groups: tuple[str, ...] = ()
    accept: Callable[[str], bool] | None = None
    needs: tuple[str, ...] = ()

    def spans(self, text: str, markers: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Return the start and end of every secret this rule finds in ``text``.

        Args:
            text: The text to scan.
            markers: Where :data:`REDACTED` already occurs in ``text``, in order.

        Returns:
            The spans of the secrets, skipping empty ones and ones made only of markers.
        """
        found: list[tuple[int, int]] = []
        for match in self.pattern.finditer(text):
            start, end = match.span()
            for name in self.groups:
                if match.group(name) is not None:
                    start, end = match.span(name)
                    break
            # An already-redacted value is not a secret. Skipping it keeps find_secrets empty on
            # redacted text, and keeps a value class that stops at "]" from turning
            # "[REDACTED]" into "[REDACTED]]" on a second pass.
            if start == end or _within_markers(start, end, markers):
                continue
            if self.accept is None or self.accept(text[start:end]):
                found.append((start, end))
        return found


_VALUE_GROUPS = ("dq", "sq", "edq", "bare")
_QUOTED_GROUPS = ("dq", "sq", "edq")
# Where a rule allows a space it allows any horizontal whitespace: text pasted from a web page,
# a chat or a word processor has no-break spaces (U+00A0), CJK input ideographic ones (U+3000).
_SP = r"[^\S\r\n]"
# Backslash escapes are honoured so that a password holding an escaped quote is not cut short.
_SINGLE_QUOTED = r"""(?:"(?P<dq>(?:[^"\\\n]|\\.)*)"|'(?P<sq>(?:[^'\\\n]|\\.)*)')"""
# JSON carried as a string inside JSON (a request body, a queue message, a log line that encodes
# an encoded payload) has its quotes escaped: {\"password\": \"...\"}, or {\\\"password\\\": ...}
# one level further down. A value opened by a quote after a run of backslashes (esc) is closed
# by the same run and a quote. Inside it, a character that is neither a quote nor a backslash
# stands for itself, and so does a run of backslashes before another character (\\n, \\u00e9);
# a run before a quote holds escaped backslashes of the inner text (2 esc + 2 each) and then
# either a quote of the inner text (2 esc + 1) or the closing run. Each run is read one way
# only, so the scan does not backtrack beyond the run it is in.
_ESCAPED_QUOTED = (
    r'(?P<esc>\\+)"(?P<edq>(?:[^"\\\n]|\\+[^"\\\n]'
    r'|(?:(?P=esc)(?P=esc)\\\\)*(?P=esc)(?P=esc)\\"'
    r'|(?:(?P=esc)(?P=esc)\\\\)+(?=(?P=esc)"))*)(?P=esc)"'
)
_QUOTED = rf"(?:{_SINGLE_QUOTED}|{_ESCAPED_QUOTED})"
# An unquoted value ends where a shell word, a query parameter or a connection-string field ends.
_BARE_IN_LINE = r"""(?P<bare>[^\s'"&;,]+)"""
_BARE_IN_JSON = r"""(?P<bare>[^\s'"&;,}\]]+)"""
# After "name:" at the start of a line (YAML, headers, env files) the value is the rest of it.
_BARE_TO_EOL = r"""(?P<bare>[^\s'"](?:[^\r\n]*\S)?)"""
# Names may carry a prefix such as DB_, x-api-, PG or db (dbPassword); where this is used the
# prefix is anchored by a quote or the start of a line, so it cannot rescan a long run; its bound
# keeps a megabyte-long line from being backtracked through once per name (about 0.1 s a line).
_NAME_PREFIX = r"[A-Za-z0-9_.-]{0,100}"
# A key's closing quote, escaped too when the key is in JSON inside a JSON string.
_KEY_QUOTE = r"""\\*["']"""


def _assignment_rules(
    kind: str, names: str, needs: tuple[str, ...], *, flags_too: bool = False
) -> list[_Rule]:
    """Build the rules for ``name = value`` and ``name: value`` written with the given names.

    Args:
        kind: The kind to report.
        names: A regex alternation of the key names, without groups that capture.
        needs: Lower-case literals of which every one of the names holds at least one.
        flags_too: Also catch a command-line option followed by its value
            (``--password hunter2``).

    Returns:
        Rules for ``=`` anywhere, after any prefix (``PGPASSWORD=``, ``dbPassword =``); for
        ``:`` after a quoted key, after a key that starts a line, or, after any prefix
        (``accessToken: '...'``), before a quoted value; and for ``:`` elsewhere only when the
        value does not read as a word or an amount, because prose uses that colon ("choose a
        strong password: at least 12 chars"). A value that only says where the secret comes
        from (``${DB_PASSWORD}``, ``os.environ[...]``, ``getpass()``) is kept. Quotes may be
        escaped (JSON inside a JSON string), and spaces may be any horizontal whitespace.
    """
    flags = re.IGNORECASE
    # No boundary before the name: whatever precedes it (PG, db, x-api-) still names a secret,
    # and a start at the name itself keeps the scan linear.
    # The lookahead on the names' first letters lets most positions fail on one character test
    # instead of trying every name (ten times faster on text that holds none).
    equals = (
        rf"""(?=[AaPpSsTt])(?:{names})(?:{_KEY_QUOTE})?{_SP}*(?:=>|:?=){_SP}*"""
        rf"""(?:{_QUOTED}|{_BARE_IN_LINE})"""
    )
    quoted_key = (
        rf"""["']{_NAME_PREFIX}(?:{names}){_KEY_QUOTE}{_SP}*:(?!=){_SP}*"""
        rf"""(?:{_QUOTED}|{_BARE_IN_JSON})"""
    )
    line_start = (
        rf"""^{_SP}*(?:-{_SP}+)?{_NAME_PREFIX}(?:{names}){_SP}*:(?!=){_SP}*"""
        rf"""(?:{_QUOTED}|{_BARE_TO_EOL})"""
    )
    # Before a quoted value, as after "=", no boundary before the name: a prefix still names
    # a secret (a JavaScript object's accessToken: '...', a log's clientSecret: "...").
    quoted_value = rf"""(?=[AaPpSsTt])(?:{names}){_SP}*:(?!=){_SP}*{_QUOTED}"""
    colon = rf"""(?<![A-Za-z0-9])(?:{names}){_SP}*:(?!=){_SP}*{_BARE_IN_LINE}"""
    rules = [
        _Rule(kind, re.compile(equals, flags), _VALUE_GROUPS, _not_placeholder, needs),
        _Rule(kind, re.compile(quoted_key, flags), _VALUE_GROUPS, _not_placeholder, needs),
        _Rule(
            kind,
            re.compile(line_start, flags | re.MULTILINE),
            _VALUE_GROUPS,
            _not_placeholder,
            needs,
        ),
        _Rule(kind, re.compile(quoted_value, flags), _QUOTED_GROUPS, _not_placeholder, needs),
        _Rule(kind, re.compile(colon, flags), ("bare",), _looks_like_value, needs),
    ]
    if flags_too:
        option = rf"""(?<![A-Za-z0-9-])--?(?:[A-Za-z0-9]+-)*(?:{names}){_SP}+"""
        option += rf"(?:{_QUOTED}|{_BARE_IN_LINE})"
        rules.append(
            _Rule(kind, re.compile(option, flags), _VALUE_GROUPS, _looks_like_value, needs)
        )
    return [*rules, *_xml_rules(kind, names, needs)]


def _xml_value_is_secret(secret: str) -> bool:
    # Indentation between an element's tags is layout, not a value.
    return not secret.isspace() and _not_placeholder(secret)


# An XML name (a tag or an attribute's value naming a setting) may carry a namespace and any
# prefix: <ns:apiToken>, key="DbPassword", name="spring.datasource.password".
_XML_PREFIX = r"[A-Za-z0-9_.:-]{0,100}"
# An element's text, or its CDATA section. The text stops at the next "<", where the next
# element (and the next match) starts, so scans of the text never overlap.
_XML_TEXT = r"(?:<!\[CDATA\[(?P<xcdata>[^\]<]*)\]\]>|(?P<xtext>[^<]*))"
# An attribute's value, closed by its own quote; quotes may be escaped, as in XML carried
# inside a JSON string. The first-letter lookahead, as in the assignment rules, lets most
# positions fail on one test.
_XML_VALUE = (
    rf"""(?=[Vv])(?<![\w.:-])value{_SP}*={_SP}*"""
    r"""(?:(?P<xe>\\*)"(?P<xdq>[^"<]*?)(?P=xe)"|(?P<xe2>\\*)'(?P<xsq>[^'<]*?)(?P=xe2)')"""
)


def _xml_rules(kind: str, names: str, needs: tuple[str, ...]) -> list[_Rule]:
    """Build the rules for the same assignments written as XML configuration.

    Args:
        kind: The kind to report.
        names: A regex alternation of the names, as for :func:`_assignment_rules`.
        needs: Lower-case literals of which every one of the names holds at least one.

    Returns:
        Rules for the text of an element named after a secret (Maven's ``<password>``,
        ``<apiToken>``, a CDATA section too), and for the ``value`` of an element whose
        ``key`` or ``name`` attribute names one, before or after it (.NET's ``<add
        key="DbPassword" value="x"/>``, Spring's and Ant's ``<property name="password"
        value="x"/>``), or its text (Java's ``<entry key="db.password">x</entry>``, Spring's
        ``<property name="password"><value>x</value></property>``). A name that only starts
        with a secret's (``<passwordPolicy>``, ``name="tokenTtl"``) names no secret, and a
        placeholder (``${db.password}``) is kept, as after ``=``.
    """
    flags = re.IGNORECASE
    # The close must name the same element: "<token>a</b>" is not one element.
    element = rf"""<(?P<xtag>{_XML_PREFIX}(?:{names}))(?:\s[^<>]*)?>{_XML_TEXT}</(?P=xtag)\s*>"""
    named = (
        rf"""(?=[KkNn])(?<![\w.:-])(?:key|name){_SP}*={_SP}*"""
        rf"""(?P<xq>\\*["']){_XML_PREFIX}(?:{names})(?P=xq)"""
    )
    # The bound keeps a run of names in one tag from being rescanned from each (linear). Text
    # after a name attribute stops at ">" too: its start is no "<" to stop the previous scan.
    name_first = (
        rf"""{named}[^<>]{{0,200}}?(?:{_XML_VALUE}|(?<!/)>(?:\s*<value>)?"""
        r"""(?:<!\[CDATA\[(?P<xcdata>[^\]<]*)\]\]>|(?P<xtext>[^<>]*))</)"""
    )
    value_first = rf"""{_XML_VALUE}[^<>]{{0,200}}?{named}"""
    text, value = ("xcdata", "xtext"), ("xdq", "xsq")
    return [
        _Rule(kind, re.compile(pattern, flags), groups, _xml_value_is_secret, needs)
        for pattern, groups in (
            (element, text),
            (name_first, (*value, *text)),
            (value_first, value),
        )
    ]


def _discord_id_segment(secret: str) -> bool:
    # A Discord bot token starts with its bot's numeric id in base64: decoding it to digits is
    # what separates a token from any three dotted base64 runs.
    head = secret.split(".", 1)[0]
    try:
        decoded = base64.b64decode(head + "=" * (-len(head) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        return False
    return decoded.isdigit()


# RFC 6750 b64token, without a trailing dot so that a sentence's full stop is kept.
_B64TOKEN = r"[A-Za-z0-9\-._~+/]*[A-Za-z0-9\-_~+/]=*"
_AUTH_HEADER = rf"""\bAuthorization["']?{_SP}*[:=]{_SP}*["']?"""
# The arguments between a command and its password option: up to 200 characters of its line,
# stopping at the next of these commands, which starts a match of its own. Without the stop, a
# line repeating "mysql " rescans 200 characters from each one (over a second per megabyte).
_COMMANDS = rf"curl|sshpass|docker{_SP}+login|redis-cli|mysql|mysqldump|mariadb"
_COMMAND_ARGS = rf"(?:(?!\b(?:{_COMMANDS})\b)[^\n]){{0,200}}?"

# Order is priority: when matches overlap they are redacted as one, and find_secrets reports the
# kind of the earliest rule among them, so self-describing token formats come before the
# contextual rules that would also match them ("token=eyJ..." is reported as a jwt).
_RULES: tuple[_Rule, ...] = (
    _Rule(
        "private-key",
        re.compile(
            # A truncated block (the END line cut off by a log limit) still holds key material.
            r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
            r"(?:.*?-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|.*)",
            re.DOTALL,
        ),
        needs=("-----begin",),
    ),
    _Rule(
        "jwt",
        # Starting only where a base64url run starts keeps the scan linear on "-eyJ-eyJ...".
        re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"),
        needs=("eyj",),
    ),
    _Rule(
        "anthropic-key",
        # No boundary before it: "sk-ant-" names a key wherever it starts (a token glued to the
        # word before it, "keysk-ant-...", still leaks), unlike the bare "sk-" of openai-key.
        re.compile(r"sk-ant-[A-Za-z0-9_-]{20,}"),
        needs=("sk-ant-",),
    ),
    _Rule(
        "openai-key",
        re.compile(r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_-]{20,}"),
        accept=_openai_body_is_key,
        needs=("sk-",),
    ),
    _Rule(
        "aws-access-key-id",
        re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
        needs=("akia", "asia"),
    ),
    _Rule(
        "github-token",
        re.compile(
            # Glued to a word before it, a classic token is known by its exact 36-character body.
            r"(?:(?<![A-Za-z0-9_])gh[pousr]_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{36}(?![A-Za-z0-9])"
            r"|github_pat_[A-Za-z0-9_]{20,})"
        ),
        needs=("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    ),
    _Rule("gitlab-token", re.compile(r"glpat-[A-Za-z0-9_-]{20,}"), needs=("glpat-",)),
    _Rule(
        "slack-token", re.compile(r"(?<![A-Za-z0-9])xox[abpors]-[A-Za-z0-9-]{10,}"), needs=("xox",)
    ),
    _Rule(
        "stripe-key",
        re.compile(
            r"(?<![A-Za-z0-9])(?:[sr]k_(?:live|test)_[A-Za-z0-9]{16,}|whsec_[A-Za-z0-9+/]{24,})"
        ),
        needs=("sk_live_", "sk_test_", "rk_live_", "rk_test_", "whsec_"),
    ),
    _Rule(
        "google-key",
        re.compile(r"(?<![A-Za-z0-9])(?:AIza[A-Za-z0-9_-]{35}|ya29\.[A-Za-z0-9_-]{20,})"),
        needs=("aiza", "ya29."),
    ),
    _Rule(
        "huggingface-token",
        re.compile(r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,}(?![A-Za-z0-9])"),
        needs=("hf_",),
    ),
    _Rule(
        "npm-token",
        re.compile(r"(?<![A-Za-z0-9_])npm_[A-Za-z0-9]{36}(?![A-Za-z0-9])"),
        needs=("npm_",),
    ),
    _Rule(
        "pypi-token",
        # Every PyPI token is a macaroon whose first bytes encode "pypi.org".
        re.compile(r"pypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{50,}"),
        needs=("pypi-ageichlwas5vcmc",),
    ),
    _Rule(
        "sendgrid-key",
        re.compile(r"(?<![A-Za-z0-9])SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])"),
        needs=("sg.",),
    ),
    _Rule(
        "telegram-token",
        re.compile(r"(?<![0-9])[0-9]{8,10}:AA[A-Za-z0-9_-]{33}(?![A-Za-z0-9_-])"),
        needs=(":aa",),
    ),
    _Rule(
        "discord-token",
        # No boundary before it: a charset first lets the engine skip to the next M, N or O.
        re.compile(
            r"[MNO][A-Za-z0-9_-]{23,27}\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,40}(?![A-Za-z0-9_-])"
        ),
        accept=_discord_id_segment,
        needs=(".",),
    ),
    _Rule(
        "webhook-url",
        # The path of a Slack or Discord webhook is its credential; the host says what it was.
        re.compile(
            r"(?:hooks\.slack\.com/(?:services|workflows|triggers)/"
            r"|discord(?:app)?\.com/api/webhooks/[0-9]+/)(?P<path>[A-Za-z0-9/_-]{8,})",
            re.IGNORECASE,
        ),
        ("path",),
        needs=("hooks.slack.com", "discord"),
    ),
    _Rule(
        "azure-sas-signature",
        re.compile(r"(?<![A-Za-z0-9])sig=(?P<sig>[A-Za-z0-9%+/=]{16,})", re.IGNORECASE),
        ("sig",),
        needs=("sig=",),
    ),
    _Rule(
        "registry-auth",
        # docker's config.json keeps base64 "user:password" under "auth".
        re.compile(
            rf"""["']auth{_KEY_QUOTE}{_SP}*:{_SP}*{_KEY_QUOTE}"""
            rf"""(?P<auth>[A-Za-z0-9+/]{{8,}}={{0,2}}){_KEY_QUOTE}"""
        ),
        ("auth",),
        needs=('"auth', "'auth"),
    ),
    *_assignment_rules(
        "aws-secret-access-key", r"aws[_-]?secret[_-]?access[_-]?key", needs=("secret",)
    ),
    _Rule(
        "url-credentials",
        # Only the password: the scheme, user and host are what make the text useful to read.
        # Anchored on "://" rather than on the scheme, whose character class would be rescanned
        # from every letter of a long run of them (quadratic on a hex or base64url blob).
        re.compile(r"://[^\s:/@?#]*:(?P<password>[^\s@/?#]+)@"),
        ("password",),
        needs=("://",),
    ),
    _Rule(
        "bearer-token",
        # In an Authorization header anything after the scheme is a credential, whatever it
        # looks like (GitHub also takes "token", Discord "Bot").
        re.compile(
            rf"{_AUTH_HEADER}(?:Bearer|token|Bot){_SP}+(?P<token>{_B64TOKEN})", re.IGNORECASE
        ),
        ("token",),
        needs=("authorization",),
    ),
    _Rule(
        "bearer-token",
        re.compile(rf"(?<![A-Za-z0-9])Bearer{_SP}+(?P<token>{_B64TOKEN})", re.IGNORECASE),
        ("token",),
        accept=_bearer_token_is_credential,
        needs=("bearer",),
    ),
    _Rule(
        "command-password",
        # Passwords given to a command on its command line: curl's user:password, a .netrc
        # entry, and the -p of commands whose -p is a password (not docker run's -p PORT).
        # The -u of other commands is a user id (docker run -u 1000:1000, sort -u), so curl's
        # is taken only after curl.
        re.compile(
            rf"(?:\bcurl\b{_COMMAND_ARGS}{_SP}(?:-u{_SP}*|--user(?:{_SP}+|=))"
            r"[\"']?[^\s:\"'$]+:(?P<user>[^\s\"'@]+)"
            rf"|\bmachine{_SP}+\S+\s+login{_SP}+\S+\s+password{_SP}+(?P<netrc>\S+)"
            rf"|\b(?:sshpass|docker{_SP}+login|redis-cli)\b{_COMMAND_ARGS}{_SP}-[pa]{_SP}+"
            r"(?P<flag>[^\s-]\S*)"
            rf"|\b(?:mysql|mysqldump|mariadb)\b{_COMMAND_ARGS}{_SP}-p(?P<glued>[^\s-]\S*))"
        ),
        ("user", "netrc", "flag", "glued"),
        _not_placeholder,
        needs=("curl", "machine", "sshpass", "docker", "redis-cli", "mysql", "mariadb"),
    ),
    _Rule(
        "basic-auth",
        re.compile(rf"{_AUTH_HEADER}Basic{_SP}+(?P<token>[A-Za-z0-9+/]+=*)", re.IGNORECASE),
        ("token",),
        needs=("basic",),
    ),
    *_assignment_rules(
        "credential-assignment",
        # "pwd" alone keeps a boundary: OLDPWD=/home/me is a directory.
        r"password|passwd|(?<![A-Za-z0-9])pwd|passphrase|token|secret(?:[_-]?key)?"
        r"|api[_-]?key|apikey|access[_-]?key|account[_-]?key|private[_-]?key",
        needs=(
            "pass",
            "pwd",
            "token",
            "secret",
            "api_key",
            "api-key",
            "apikey",
            "accesskey",
            "access_key",
            "access-key",
            "accountkey",
            "account_key",
            "account-key",
            "privatekey",
            "private_key",
            "private-key",
        ),
        flags_too=True,
    ),
)


assert all(rule.needs for rule in _RULES), "every rule names the literals it is anchored on"
_LITERALS: tuple[str, ...] = tuple(sorted({n for rule in _RULES for n in rule.needs}))
# One substring test per distinct literal, then the rules of the literals found: with some fifty
# literals this is several times cheaper than testing each rule's literals in turn, and than one
# regex of them all.
_BY_LITERAL: dict[str, tuple[int, ...]] = {
    literal: tuple(p for p, rule in enumerate(_RULES) if literal in rule.needs)
    for literal in _LITERALS
}
"""Literal -> the priorities of the rules that need it: the rules a text can match are those of
the literals it holds, found without testing every rule."""


@dataclass(slots=True)
class _Hit:
    """A stretch of text to redact and the kind of secret it was reported as."""

    start: int
    end: int
    kind: str


def _widen(start: int, end: int, markers: list[tuple[int, int]]) -> tuple[int, int]:
    """Stretch ``[start, end)`` to cover whole any marker it cuts into."""
    first = _marker_at(start, markers)
    if first is not None:
        start = markers[first][0]
    last = _marker_at(end - 1, markers)
    if last is not None:
        end = markers[last][1]
    return start, end


def _scan(
    text: str, *, prefilter: bool = True, within: list[tuple[int, int]] | None = None
) -> list[_Hit]:
    """Find every secret in ``text``, with overlapping and touching matches merged.

    Matching every rule against the same text, rather than against text already partly
    redacted, lets overlapping matches be merged: a value that two rules see differently
    (``password=foo/sk-...``) is redacted whole.

    Most text holds none of the literals the rules are anchored on, so on ASCII text the rules
    that cannot match are skipped (case-insensitive matching of non-ASCII text folds letters
    such as the long s (U+017F) to "s", which ``str.lower`` does not, so such text runs every rule).

    Args:
        text: The text to scan.
        prefilter: Skip the rules that cannot match; off only to check that skipping changes
            nothing.
        within: Disjoint spans of ``text``, in order: a match that does not lie inside one of
            them is dropped before matches are merged, so that it cannot swallow one that does.

    Returns:
        Disjoint hits in order of position, each with the kind of the highest-priority rule
        that matched inside it. No hit cuts into a marker, and each holds some text that is
        not a marker.
    """
    if prefilter and text.isascii():
        lowered = text.lower()
        wanted = {p for n in _LITERALS if n in lowered for p in _BY_LITERAL[n]}
        if not wanted:
            return []
        rules = [(p, _RULES[p]) for p in sorted(wanted)]
    else:
        rules = list(enumerate(_RULES))
    if not rules:
        return []
    markers = [match.span() for match in _MARKER.finditer(text)]
    found = sorted(
        (*_widen(start, end, markers), priority, rule.kind)
        for priority, rule in rules
        for start, end in rule.spans(text, markers)
    )
    if within is not None:
        starts = [span[0] for span in within]
        found = [
            match
            for match in found
            if (index := bisect.bisect_right(starts, match[0]) - 1) >= 0
            and match[1] <= within[index][1]
        ]
    hits: list[_Hit] = []
    best = len(_RULES)
    for start, end, priority, kind in found:
        # Touching spans are merged too, so two markers never end up side by side.
        if hits and start <= hits[-1].end:
            last = hits[-1]
            last.end = max(last.end, end)
            if priority < best:
                best, last.kind = priority, kind
        else:
            hits.append(_Hit(start, end, kind))
            best = priority
    return hits


def _redact(text: str) -> tuple[str, list[str]]:
    """Redact ``text`` until no rule finds anything, and name the kinds found on the way.

    One pass is not always enough: a rule's context can change once its neighbour becomes a
    marker (the tail of a value that only part of was a key, say), and redaction must be
    idempotent. Every pass turns at least one character that is not part of a marker into a
    marker and never cuts an existing marker, so the loop ends; it rarely runs a second pass.

    Args:
        text: The text to redact.

    Returns:
        The redacted text and the kinds found, in order of first appearance, without
        duplicates.
    """
    kinds: dict[str, None] = {}
    while hits := _scan(text):
        kinds.update(dict.fromkeys(hit.kind for hit in hits))
        parts: list[str] = []
        position = 0
        for hit in hits:
            parts.extend((text[position : hit.start], REDACTED))
            position = hit.end
        parts.append(text[position:])
        redacted = "".join(parts)
        # Every pass shrinks the text outside markers, so this never triggers; it is here so
        # that a mistake in that reasoning costs a missed redaction, not a hung journal.
        if redacted == text:
            break
        text = redacted
    return text, list(kinds)


def redact(text: str) -> str:
    """Return ``text`` with every secret replaced by :data:`REDACTED`.

    Args:
        text: Free text about to be journaled: a prompt, a tool call, a tool's output.

    Returns:
        The text with each secret, and only the secret, replaced by the marker. Applying
        ``redact`` again returns the same text.
    """
    return _redact(text)[0]


def redact_report(text: str) -> tuple[str, list[str]]:
    """Redact ``text`` and name the kinds of secret removed, in one pass over the rules.

    Args:
        text: Free text about to be journaled.

    Returns:
        ``(redact(text), find_secrets(text))``, computed once.
    """
    return _redact(text)


def find_secrets(text: str) -> list[str]:
    """Name the kinds of secret in ``text``, as :func:`redact` would see them.

    Args:
        text: The text to scan.

    Returns:
        Kind names such as ``"openai-key"`` or ``"jwt"``, in order of first appearance and
        without duplicates; empty when there is nothing to redact.
    """
    return _redact(text)[1]


_SECRET_NAME = re.compile(
    r"[A-Za-z0-9_.-]*(?:password|passwd|pwd|passphrase|token|secret(?:[_-]?key)?|api[_-]?key"
    r"|apikey|access[_-]?key|account[_-]?key|private[_-]?key|auth|authorization|credentials?)",
    re.IGNORECASE,
)


# The last three letters of every name _SECRET_NAME ends with: most keys fail on this one test.
_SECRET_ENDINGS = frozenset(
    ("ord", "swd", "pwd", "ase", "ken", "ret", "key", "uth", "ion", "ial", "als")
)


def _names_secret(name: Any) -> bool:
    """Return whether ``name`` is a string that names a secret (``password``, ``DB_PASSWORD``)."""
    if not isinstance(name, str):
        return False
    # Letters outside ASCII may fold to a name's (a long s to "s"): those keys take the regex.
    if name.isascii() and name[-3:].lower() not in _SECRET_ENDINGS:
        return False
    return _SECRET_NAME.fullmatch(name) is not None


def _hide(item: Any) -> Any:
    """Return a scalar held under a name of a secret: replaced whole unless a placeholder.

    Strings (but the empty one and placeholders, which are redacted as text) and numbers are
    replaced; None and booleans say nothing and are kept.
    """
    if isinstance(item, str):
        return REDACTED if item and _not_placeholder(item) else redact(item)
    if isinstance(item, int | float) and not isinstance(item, bool):
        return REDACTED
    return item


_Container = dict[Any, Any] | list[Any] | tuple[Any, ...] | frozenset[Any]
"""What :func:`redact_data` walks: frozensets come as parts of keys (``{("alice", token): 1}``)."""
_CONTAINERS = (dict, list, tuple, frozenset)

_NAME_FIELDS = ("name", "Name", "NAME", "key", "Key", "KEY")
_VALUE_FIELDS = ("value", "Value", "VALUE")
_NOTHING: frozenset[Any] = frozenset()


def _assigned(container: _Container) -> frozenset[Any]:
    """Return the keys or indices of ``container`` whose items a name of a secret is given to.

    A mapping with a ``name`` or ``key`` naming a secret assigns its ``value`` to that name
    (a Kubernetes env entry, a HAR header, an AWS tag), and so does a pair whose first item
    names one (``["Authorization", "Basic ..."]``, header pairs as httpx and ASGI give them).
    Field names may be lower-case, capitalised (AWS's ``Key``/``Value``) or upper-case.
    """
    if isinstance(container, dict):
        if "value" not in container and "Value" not in container and "VALUE" not in container:
            return _NOTHING  # most dicts: three lookups
        if any(_names_secret(container.get(field)) for field in _NAME_FIELDS):
            return frozenset(field for field in _VALUE_FIELDS if field in container)
        return _NOTHING
    if isinstance(container, list | tuple) and len(container) == 2 and _names_secret(container[0]):
        return frozenset((1,))
    return _NOTHING


def _command_line(container: Any) -> list[str] | tuple[str, ...] | None:
    """Redact a list of strings as the command line it spells, or return None for another value.

    A shell tool takes its command as an argv list (``["sshpass", "-p", pw, "ssh", host]``):
    the password is an item of its own, and only the items around it say that it is one. Each
    item is redacted as text; then the items, joined by spaces, are scanned as one line, and
    what a match finds within one item is redacted in that item (a match that spans items is
    left to the items themselves, which keeps a value that runs to the end of a line from
    taking the next item with it). Until nothing is left to find, as :func:`redact` does. A
    pair whose first item names a secret is not a command line: its second item is replaced
    whole.
    """
    if (
        not isinstance(container, list | tuple)
        or len(container) < 2
        or not isinstance(container[0], str)
        or not all(isinstance(item, str) for item in container)
        or _assigned(container)
    ):
        return None
    parts = [redact(item) for item in container]
    while True:
        spans: list[tuple[int, int]] = []
        position = 0
        for part in parts:
            spans.append((position, position + len(part)))
            position += len(part) + 1
        starts = [span[0] for span in spans]
        by_item: dict[int, list[_Hit]] = {}
        for hit in _scan(" ".join(parts), within=spans):
            by_item.setdefault(bisect.bisect_right(starts, hit.start) - 1, []).append(hit)
        if not by_item:
            return parts if isinstance(container, list) else type(container)(parts)
        # Every hit holds text that is not a marker, so each round leaves less of it: the loop
        # ends, and on text that was already redacted it finds nothing.
        for index, hits in by_item.items():
            base, part = starts[index], parts[index]
            pieces: list[str] = []
            position = 0
            for hit in hits:
                pieces.extend((part[position : hit.start - base], REDACTED))
                position = hit.end - base
            pieces.append(part[position:])
            redacted = "".join(pieces)
            # An item that is now only the marker has nothing left to find.
            parts[index] = redacted if redacted == REDACTED else redact(redacted)


@dataclass(slots=True)
class _Frame:
    """A container that :func:`redact_data` is copying.

    Attributes:
        source: The container.
        entries: Its ``(key, item)`` pairs still to copy; a list's keys are its indices.
        hidden: Whether it sits under a name of a secret: every scalar in it is replaced.
        assigned: The keys or indices whose items a name of a secret is given to.
        copy: The copy being built (a list for a tuple or a frozenset, made one when done).
        numbers: The next number to try for each key that collided after redaction.
        slot: Where the child being walked goes into the copy.
    """

    source: _Container
    entries: Iterator[tuple[Any, Any]]
    hidden: bool
    assigned: frozenset[Any]
    copy: dict[Any, Any] | list[Any]
    numbers: dict[Any, int] | None = None
    slot: Any = None


def _numbered(key: Any, number: int) -> Any:
    """Return ``key`` with ``number`` added, of the key's own type."""
    if isinstance(key, str):
        return f"{key} {number}"
    if isinstance(key, tuple):
        return (*key, number)
    return key | {number}


def _unused_key(key: Any, frame: _Frame) -> Any:
    """Return ``key``, or, when the frame's copy already holds it, ``key`` numbered from 2 on.

    Two keys that redact alike (two tokens) must not make one entry overwrite the other; the
    numbers follow the order of the entries, so a replay numbers them the same way. A string
    key gets `` 2``, a tuple a last item ``2`` and a frozenset an item ``2``, so the key keeps
    its type.
    """
    copy = frame.copy
    if key not in copy:
        return key
    if frame.numbers is None:
        frame.numbers = {}
    numbers = frame.numbers
    number = numbers.get(key, 2)
    while _numbered(key, number) in copy:
        number += 1
    numbers[key] = number + 1
    return _numbered(key, number)


def _frame(container: _Container, *, hidden: bool) -> _Frame:
    """Return the frame that starts copying ``container``."""
    if isinstance(container, dict):
        entries: Iterator[tuple[Any, Any]] = iter(container.items())
        copy: dict[Any, Any] | list[Any] = {}
    else:
        entries, copy = enumerate(container), []
    return _Frame(container, entries, hidden, _NOTHING if hidden else _assigned(container), copy)


def redact_data(value: Any) -> Any:
    """Return structured run data (msgspec builtins) with every secret replaced (M9).

    Strings are redacted as text, string keys included (a map from tokens to their owners
    holds its secrets in its keys; keys that then collide are numbered, ``[REDACTED]``,
    ``[REDACTED] 2``, so that no entry is lost). A tuple or frozenset key is redacted as the
    same items would be as a value, keeping its type (``("alice", "[REDACTED]")``); one that
    then collides gets its number as a further item (``("alice", "[REDACTED]", 2)``). What is
    stored under a name of a secret is replaced whole, unless it is a placeholder: a string or
    number under such a key (``{"password": "hunter2"}``, ``{"apiKey": 123}``), every string
    and number inside a list or dict under it, however deep (``{"client_secret": {"value":
    "x"}}``), and the value of a name/value mapping or of a pair that names a secret
    (``{"name": "DB_PASSWORD", "value": "x"}``, ``["Authorization", "Basic ..."]``). A list of
    strings is also redacted as the command line it spells (``["sshpass", "-p", "x", "ssh",
    "host"]``). Lists, tuples, frozensets and dicts are walked without recursion, so data
    nested as deep as the journal can encode it does not exhaust the stack (a key is walked by
    a call of its own: keys hold no dict, so that call holds no key).

    Args:
        value: A step's input or output, an agent's data, an answer: anything journalable.

    Returns:
        The same structure in new containers, with the secrets replaced.
    """
    if not isinstance(value, _CONTAINERS):
        return redact(value) if isinstance(value, str) else value
    line = _command_line(value)
    if line is not None:
        return line
    stack = [_frame(value, hidden=False)]
    while True:
        frame = stack[-1]
        copy = frame.copy
        for key, item in frame.entries:
            hidden = frame.hidden or key in frame.assigned
            if isinstance(copy, dict):
                if isinstance(key, str):
                    redacted = redact(key)
                    hidden = hidden or _names_secret(redacted)
                    key = _unused_key(redacted, frame)  # noqa: PLW2901
                elif isinstance(key, tuple | frozenset):
                    # Read as the same items would be as a value; a key is never hidden.
                    key = _unused_key(redact_data(key), frame)  # noqa: PLW2901
            if isinstance(item, _CONTAINERS):
                leaf: Any = None if hidden or isinstance(item, dict) else _command_line(item)
                if leaf is None:
                    # The child is copied whole before the next entry: its place is its key,
                    # or the end of the list, held for it.
                    if isinstance(copy, dict):
                        frame.slot = key
                    else:
                        frame.slot = len(copy)
                        copy.append(None)
                    stack.append(_frame(item, hidden=hidden))
                    break
            elif hidden:
                leaf = _hide(item)
            else:
                leaf = redact(item) if isinstance(item, str) else item
            if isinstance(copy, dict):
                copy[key] = leaf
            else:
                copy.append(leaf)
        else:
            stack.pop()
            done = copy if isinstance(frame.source, dict | list) else type(frame.source)(copy)
            if not stack:
                return done
            parent = stack[-1]
            parent.copy[parent.slot] = done
