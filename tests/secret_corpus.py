"""A deterministic corpus of fake secrets in realistic context, and of look-alikes (M9).

Every token is generated from a seeded random source in the documented shape of its kind
(prefix, alphabet, length), so it is format-correct yet never a live credential, and no literal
in this file looks like one to a secret scanner. :data:`SECRETS` pairs a text (a config file, a
shell history, JSON, a log line, a URL, code) with the secret values that must not survive
redaction; :data:`LOOK_ALIKES` holds texts that must come back unchanged: placeholders, commit
hashes, UUIDs, digests, prose about passwords, documentation examples.
"""

from __future__ import annotations

import base64
import random
import string
import uuid

__all__ = ["LOOK_ALIKES", "SECRETS", "Case"]

Case = tuple[str, str, tuple[str, ...]]
"""(kind, text, the secret values in the text)."""

_rng = random.Random(20261130)
_ALNUM = string.ascii_letters + string.digits
_URLSAFE = _ALNUM + "-_"


def _pick(alphabet: str, n: int) -> str:
    return "".join(_rng.choice(alphabet) for _ in range(n))


def _password() -> str:
    # Passwords people type: letters, digits and a few symbols that survive shells and URLs.
    return _pick(_ALNUM, _rng.randint(6, 10)) + _pick("!%*+-_", 1) + _pick(_ALNUM, 4)


def _b64(n: int) -> str:
    return base64.b64encode(_rng.randbytes(n)).decode()


def _discord() -> str:
    user = str(_rng.randint(10**17, 10**19 - 1)).encode()
    head = base64.urlsafe_b64encode(user).decode().rstrip("=")
    return f"{head}.{_pick(_URLSAFE, 6)}.{_pick(_URLSAFE, 38)}"


def _jwt() -> str:
    header = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').decode().rstrip("=")
    body = base64.urlsafe_b64encode(
        f'{{"sub":"{_rng.randint(1, 10**9)}","exp":{_rng.randint(1, 10**10)}}}'.encode()
    )
    return f"{header}.{body.decode().rstrip('=')}.{_pick(_URLSAFE, 43)}"


_GENERATORS = {
    "openai": lambda: "sk-proj-" + _pick(_URLSAFE, 48),
    "openai-legacy": lambda: "sk-" + _pick(_ALNUM, 48),
    "anthropic": lambda: "sk-ant-api03-" + _pick(_URLSAFE, 93) + "AA",
    "aws-id": lambda: "AKIA" + _pick(string.ascii_uppercase + string.digits, 16),
    "github": lambda: "ghp_" + _pick(_ALNUM, 36),
    "github-fine": lambda: "github_pat_" + _pick(_ALNUM, 22) + "_" + _pick(_ALNUM, 59),
    "gitlab": lambda: "glpat-" + _pick(_URLSAFE, 20),
    "slack": lambda: (
        f"xoxb-{_pick(string.digits, 12)}-{_pick(string.digits, 13)}-" + _pick(_ALNUM, 24)
    ),
    "stripe-secret": lambda: "sk_live_" + _pick(_ALNUM, 99),
    "stripe-restricted": lambda: "rk_live_" + _pick(_ALNUM, 99),
    "stripe-webhook": lambda: "whsec_" + _pick(_ALNUM, 32),
    "google-api": lambda: "AIza" + _pick(_URLSAFE, 35),
    "google-oauth": lambda: "ya29." + _pick(_URLSAFE, 120),
    "huggingface": lambda: "hf_" + _pick(string.ascii_letters, 34),
    "npm": lambda: "npm_" + _pick(_ALNUM, 36),
    "pypi": lambda: "pypi-AgEIcHlwaS5vcmc" + _pick(_URLSAFE, 140),
    "sendgrid": lambda: f"SG.{_pick(_URLSAFE, 22)}.{_pick(_URLSAFE, 43)}",
    "telegram": lambda: f"{_rng.randint(10**8, 10**10 - 1)}:AA{_pick(_URLSAFE, 33)}",
    "discord": _discord,
    "jwt": _jwt,
}

# Contexts in which a self-describing token turns up; {s} is the token.
_TOKEN_CONTEXTS = (
    "export {env}={s}",
    '{{"name": "deploy", "{key}": "{s}", "region": "eu-west-1"}}',
    "2026-11-30T10:14:03Z INFO client configured with {s} (retry=3)",
    'client = Client(api_key="{s}", timeout=30)',
    "  {key}: {s}\n  timeout: 30",
    "$ curl -s https://api.example.com/v1/me -H 'X-Auth: {s}'",
    "the key {s} was rotated yesterday, see ticket OPS-4411",
)


def _token_cases() -> list[Case]:
    cases: list[Case] = []
    for kind, make in _GENERATORS.items():
        env = kind.upper().replace("-", "_") + "_TOKEN"
        for number, context in enumerate(_TOKEN_CONTEXTS):
            if (number + len(kind)) % 7 in (5, 6) and kind not in ("discord", "telegram"):
                continue  # not every kind in every context: enough variety, shorter runs
            token = make()
            text = context.format(env=env, key=kind.replace("-", "_") + "_key", s=token)
            cases.append((kind, text, (token,)))
    return cases


def _context_cases() -> list[Case]:
    cases: list[Case] = []
    for _ in range(2):
        pw = _password()
        cases += [
            ("env-password", f"DB_HOST=db.internal\nDB_PASSWORD={pw}\nDB_PORT=5432", (pw,)),
            ("pgpassword", f"$ PGPASSWORD={pw} psql -h db -U app app", (pw,)),
            ("cli-password", f"$ mysql -u root --password {pw} -e 'show tables'", (pw,)),
            ("cli-token", f"$ vault login --token {pw}", (pw,)),
            ("cli-password", f"$ psql --password={pw} -U app", (pw,)),
            ("json-password", f'{{"user": "app", "password": "{pw}", "port": 5432}}', (pw,)),
            ("yaml-password", f"database:\n  user: app\n  password: {pw}\n", (pw,)),
            ("camel-password", f'const dbPassword = "{pw}";', (pw,)),
            ("camel-token", f"accessToken: '{pw}',", (pw,)),
            ("camel-secret", f'  "clientSecret": "{pw}",', (pw,)),
            ("camel-secret", f"oauth.clientSecret={pw}", (pw,)),
            ("url-password", f"DATABASE_URL=postgres://app:{pw}@db.internal:5432/app", (pw,)),
            ("url-password", f"git clone https://bob:{pw}@git.example.com/team/repo.git", (pw,)),
            ("python-password", f'conn = connect(host="db", password="{pw}")', (pw,)),
            ("ini-password", f"[client]\nuser = app\npassword = {pw}\n", (pw,)),
            ("secret-key", f"SECRET_KEY = '{pw}{pw}'", (f"{pw}{pw}",)),
            ("query-token", f"GET /v1/export?format=csv&access_token={pw} HTTP/1.1", (pw,)),
            ("header-api-key", f"curl -H 'X-API-Key: {pw}' https://api.example.com", (pw,)),
            ("log-password", f"WARN login failed for bob (password: {pw})", (pw,)),
            ("curl-user", f"$ curl -u bob:{pw} https://api.example.com/v1/me", (pw,)),
            ("netrc", f"machine api.example.com\n  login bob\n  password {pw}\n", (pw,)),
            ("sshpass", f"$ sshpass -p '{pw}' ssh deploy@web-1", (pw,)),
            ("mysql-p", f"$ mysqldump -uroot -p{pw} shop > shop.sql", (pw,)),
            ("docker-login", f"$ docker login -u bob -p {pw} ghcr.io", (pw,)),
            ("npmrc", f"//registry.npmjs.org/:_authToken={pw}", (pw,)),
            ("k8s-secret", f"kind: Secret\ndata:\n  password: {_b64(12)}{pw}\n", (pw,)),
            (
                "maven-settings",
                f"<server>\n  <id>nexus</id>\n  <username>deploy</username>\n"
                f"  <password>{pw}</password>\n</server>",
                (pw,),
            ),
            ("dotnet-config", f'<appSettings>\n  <add key="DbPassword" value="{pw}" />', (pw,)),
            ("spring-xml", f'<property name="spring.datasource.password" value="{pw}"/>', (pw,)),
            ("xml-token", f"<config><apiToken>{pw}</apiToken></config>", (pw,)),
        ]
        bearer = _pick(_URLSAFE, 40)
        basic = base64.b64encode(f"bob:{pw}".encode()).decode()
        cases += [
            ("bearer", f"Authorization: Bearer {bearer}", (bearer,)),
            ("github-header", f"-H 'Authorization: token {bearer}'", (bearer,)),
            (
                "bearer",
                f"curl -H 'Authorization: Bearer {bearer}' https://x.example.com",
                (bearer,),
            ),
            ("basic", f"Authorization: Basic {basic}", (basic,)),
            ("docker-auth", f'{{"auths": {{"ghcr.io": {{"auth": "{basic}"}}}}}}', (basic,)),
        ]
        account = _b64(64)
        sig = _b64(32).replace("+", "%2B").replace("/", "%2F").replace("=", "%3D")
        cases += [
            (
                "azure-connection",
                "DefaultEndpointsProtocol=https;AccountName=acme;"
                f"AccountKey={account};EndpointSuffix=core.windows.net",
                (account,),
            ),
            (
                "azure-sas",
                "https://acme.blob.core.windows.net/logs/a.txt?sv=2022-11-02&ss=b&srt=o&sp=r"
                f"&se=2026-12-01T00:00:00Z&sig={sig}",
                (sig,),
            ),
        ]
        key_id = "ASIA" + _pick(string.ascii_uppercase + string.digits, 16)
        secret = _b64(30)
        session = _b64(300)
        cases.append(
            (
                "aws-sts-json",
                '{"Credentials": {"AccessKeyId": "' + key_id + '", "SecretAccessKey": "'
                f'{secret}", "SessionToken": "{session}", "Expiration": '
                '"2026-11-30T12:00:00Z"}}',
                (key_id, secret, session),
            )
        )
        aws_secret = _b64(30)
        cases.append(
            (
                "aws-ini",
                f"[default]\naws_access_key_id = AKIA{_pick(string.ascii_uppercase, 16)}\n"
                f"aws_secret_access_key = {aws_secret}\n",
                (aws_secret,),
            )
        )
        hook = f"T{_pick(string.ascii_uppercase + string.digits, 8)}/B{_pick(string.digits, 10)}"
        hook += "/" + _pick(_ALNUM, 24)
        cases.append(
            (
                "slack-webhook",
                f"requests.post('https://hooks.slack.com/services/{hook}', json=msg)",
                (hook,),
            )
        )
        discord_hook = _pick(_URLSAFE, 68)
        cases.append(
            (
                "discord-webhook",
                f"WEBHOOK=https://discord.com/api/webhooks/{_rng.randint(10**17, 10**18)}/"
                + discord_hook,
                (discord_hook,),
            )
        )
        body = "\n".join(_b64(48) for _ in range(6))
        cases.append(
            (
                "private-key",
                f"key.pem:\n-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----\n",
                (body,),
            )
        )
    return cases


SECRETS: list[Case] = _token_cases() + _context_cases()
"""Texts holding secrets, each with the values that must be gone after redaction."""


def _hex(n: int) -> str:
    return _pick("0123456789abcdef", n)


def _look_alikes() -> list[str]:
    texts = [
        # Placeholders: they say where a secret comes from, not what it is.
        "DB_PASSWORD=${DB_PASSWORD}",
        "password: ${POSTGRES_PASSWORD}",
        '{"password": "${DB_PASSWORD}", "user": "app"}',
        "password = os.environ['DB_PASSWORD']",
        'token = os.environ.get("GITHUB_TOKEN")',
        'api_key = os.getenv("OPENAI_API_KEY")',
        "password = getpass()",
        "password = getpass.getpass('Password: ')",
        "const token = process.env.SLACK_TOKEN;",
        "  password: {{ secrets.DB_PASSWORD }}",
        "token: {{ .Values.token }}",
        "PGPASSWORD=$PGPASS psql -h db",
        "export API_KEY=$(cat /run/secrets/api_key)",
        "password=<your-password>",
        "api_key: <API_KEY>",
        "--password <password>",
        "secret = settings.SECRET",
        "password = self.password",
        "token = config.token",
        "password: ********",
        "password=xxxxxxxx",
        "api_key = 'YOUR_API_KEY'",
        "token: your-token-here",
        "password = None",
        "password: null",
        "SECRET_KEY = get_secret('django')",
        "client_secret=%(client_secret)s",
        "password: [PASSWORD]",
        "docker login --password-stdin < token.txt",
        "password_file=/run/secrets/db_password",
        "OLDPWD=/home/bob/src",
        "curl -u $API_USER:$API_PASS https://api.example.com",
        "docker run -p 8080:80 -e MODE=prod nginx",
        "mysql -u root -p shop",
        "machine learning models need a login page and a password reset flow",
        "curl -u bob https://api.example.com  # prompts for the password",
        "spring.datasource.password=${db.password}",
        "<password>${env.NEXUS_PASSWORD}</password>",
        '<property name="password" value="${db.password}"/>',
        # Prose.
        "Please reset your password via the account page.",
        "The password must have at least twelve characters.",
        "Tokens are counted per request; see the token budget section.",
        "We store secrets in the vault, never in the repository.",
        "Set max_tokens=4096 and temperature=0.2 for the summary call.",
        "The API key is passed in a header, never in the query string.",
        "A bearer token grants access to whoever holds it.",
        "Rotate the secret keys every 90 days, says the policy.",
        "Forgot password? Click the link in the email.",
        "token_count: 512",
        "the tokenizer: sentencepiece",
        "The Slack app posts to a webhook configured by the admin.",
        "Discord bots need the message content intent.",
        "Use pip install scikit-learn, not sk-learn.",
        "sk-learn-compatible estimators and sk-ills are prose.",
        "Hugging Face models are pulled with hf_hub_download().",
        "npm_config_registry points at the mirror.",
        "The Stripe test mode uses keys that begin with sk_test_ followed by letters.",
        "AIza is the prefix of Google API keys.",
        "Telegram bot tokens look like 123:ABC in the docs.",
        "sig= is the signature parameter of a SAS URL.",
        "The auth field in docker's config is base64.",
        # Identifiers that are not secrets.
        "The AccessKeyId field names the key; it is not secret by itself.",
        "https://example.com:8443/path?page=2&sort=asc",
        "postgresql://localhost/app and redis://cache:6379/0",
        "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8A\n-----END PUBLIC KEY-----",
        "-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+gAwIBAgIEAgAAuTANBgkq\n-----END CERTIFICATE-----",
        "image: ghcr.io/acme/app@sha256:" + _hex(64),
        "Signature: sig-v4 (see the AWS docs)",
        # XML about secrets, holding none.
        "<page><name>password reset page</name><path>/account/reset</path></page>",
        '<property name="passwordLength" value="12"/>',
        '<add key="TokenLifetimeMinutes" value="30" />',
        "<passwordPolicy>min-length-12</passwordPolicy>",
        '<input type="password" name="password" placeholder="Password" />',
    ]
    texts += [f"commit {_hex(40)}\nAuthor: Bob <bob@example.com>\n\n    Fix it" for _ in range(12)]
    texts += [f"request {uuid.UUID(int=_rng.getrandbits(128))} took 41 ms" for _ in range(10)]
    texts += [f"sha256sum: {_hex(64)}  dist/app.tar.gz" for _ in range(8)]
    texts += [
        f"Merge pull request #{_rng.randint(1, 9999)} from acme/fix-{_hex(7)}" for _ in range(6)
    ]
    texts += [
        f'{{"id": "{uuid.UUID(int=_rng.getrandbits(128))}", "etag": "{_hex(32)}"}}'
        for _ in range(6)
    ]
    texts += [f"md5 {_hex(32)} and build {_rng.randint(1000, 9999)}" for _ in range(4)]
    return texts


LOOK_ALIKES: list[str] = _look_alikes()
"""Texts without secrets that redaction must leave unchanged."""
