"""Long-term site keys: who sent a SecAgg+ public key, and which peers a site masked with.

SecAgg+ (Flower 1.42) has no signatures: its per-run public keys (ECDH on P-384) pass
through the server, which could put keys of its own in place of a site's peers and
decrypt that site's key shares. Each site therefore holds a long-term Ed25519 key
(node config ``signing-key``, a PEM file) and pins every member's public key (node
config ``peers``, a JSON file ``{"site-id": "<base64 of the 32-byte public key>"}``).
A site signs statements bound to the run id and its node id:

    keys    its two SecAgg+ public keys, with its setup reply
    view    the nodes whose key shares it received -- the peers it masked with -- with
            its masked vector
    attest  the noise it added and the policy it applied, with its round-1 or plain
            reply (the table's ``.meta.json`` carries it: :func:`verify_attestation`)

and checks its peers' statements before it encrypts shares to them or unmasks
(:mod:`distrank.flower.secure.site`). Make a key and print its public half with
``python -m distrank.flower.identity oslo.key``.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

_DOMAIN = "distrank secure mode, signed statement, v1"


class BadStatement(ValueError):
    """A statement that is not signed by the pinned key of the site it names, or that
    does not say what it must."""


@dataclass(frozen=True)
class Statement:
    """What a site signs: ``kind`` ("keys" or "view"), the run and node it is about, the
    site, and its content (base64 public keys, or the node ids of a view)."""

    kind: str
    run: int
    node: int
    site: str
    content: tuple

    def encode(self) -> bytes:
        fields = [_DOMAIN, self.kind, self.run, self.node, self.site, list(self.content)]
        return json.dumps(fields, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Statement:
        try:
            domain, kind, run, node, site, content = json.loads(data)
        except (ValueError, TypeError) as err:
            raise BadStatement(f"a statement that does not parse: {err}") from None
        if domain != _DOMAIN:
            raise BadStatement(f"a statement of another protocol: {domain!r}")
        return cls(kind, run, node, site, tuple(content))


def keys_content(pk1: bytes, pk2: bytes) -> tuple[str, str]:
    return base64.b64encode(pk1).decode(), base64.b64encode(pk2).decode()


@dataclass(frozen=True)
class Identity:
    """A site's long-term signing key and the public keys it pins, by site id."""

    site: str
    key: Ed25519PrivateKey
    peers: Mapping[str, Ed25519PublicKey]

    @classmethod
    def load(cls, site, key_path: Path, peers_path: Path) -> Identity:
        """The identity of node config ``signing-key`` and ``peers``; a ValueError names
        the file, and the site's own public key must be among the pinned ones."""
        try:
            key = serialization.load_pem_private_key(Path(key_path).read_bytes(), None)
        except (OSError, ValueError, TypeError) as err:
            raise ValueError(f"{key_path}: not a readable PEM private key ({err})") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{key_path}: expected an Ed25519 private key")
        try:
            pinned = json.loads(Path(peers_path).read_text())
            peers = {str(s): _public(v) for s, v in pinned.items()}
        except (OSError, ValueError, TypeError, AttributeError) as err:
            raise ValueError(
                f"{peers_path}: expected JSON {{site-id: base64 Ed25519 public key}} ({err})"
            ) from None
        if str(site) not in peers or public_text(peers[str(site)]) != public_text(key):
            raise ValueError(f"{peers_path}: does not pin this site's key under {str(site)!r}")
        return cls(str(site), key, peers)

    def sign(self, statement: Statement) -> list[bytes]:
        """[statement, signature]: what travels in a ConfigRecord."""
        data = statement.encode()
        return [data, self.key.sign(data)]

    def verify(self, signed, kind: str, run: int, node: int) -> Statement:
        """The statement of ``signed`` ([statement, signature]) if a pinned site signed
        it and it is a ``kind`` statement about ``run`` and ``node``; else BadStatement."""
        try:
            data, signature = signed
            statement = Statement.decode(data)
        except (TypeError, ValueError) as err:
            raise BadStatement(f"node {node}: no signed {kind} statement ({err})") from None
        if statement.site not in self.peers:
            raise BadStatement(f"node {node}: signed by {statement.site!r}, a site not pinned")
        try:
            self.peers[statement.site].verify(signature, data)
        except InvalidSignature:
            raise BadStatement(f"node {node}: a bad signature for {statement.site!r}") from None
        if (statement.kind, statement.run, statement.node) != (kind, run, node):
            raise BadStatement(
                f"node {node}: {statement.site!r} signed a {statement.kind} statement about "
                f"run {statement.run}, node {statement.node}"
            )
        return statement


def verify_attestation(attested: Mapping, peers_path: Path) -> str:
    """The site that signed ``attested`` (an entry of a table's ``.meta.json``: what a
    site attests, with ``signed``, the base64 [statement, signature]) if its pinned key
    in ``peers_path`` signed exactly this content; else BadStatement."""
    try:
        pinned = json.loads(Path(peers_path).read_text())
        data, signature = (base64.b64decode(b) for b in attested["signed"])
        statement = Statement.decode(data)
        key = _public(pinned[statement.site])
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise BadStatement(f"no checkable signed attestation ({err!r})") from None
    try:
        key.verify(signature, data)
    except InvalidSignature:
        raise BadStatement(f"a bad signature for {statement.site!r}") from None
    said = {k: v for k, v in attested.items() if k != "signed"}
    if statement.kind != "attest" or json.loads(statement.content[0]) != said:
        raise BadStatement(f"{statement.site!r} signed other content than this attestation")
    return statement.site


def public_text(key) -> str:
    """The base64 of a public key (or a private key's public half), as ``peers`` pins it."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def _public(text: str) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(base64.b64decode(text, validate=True))


def new_key(path: Path) -> str:
    """Write a new Ed25519 private key to ``path`` (PEM, mode 600) unless one is there;
    return its public key as ``peers`` pins it."""
    path = Path(path)
    if not path.exists():
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        path.touch(mode=0o600)
        path.write_bytes(pem)
    return public_text(serialization.load_pem_private_key(path.read_bytes(), None))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m distrank.flower.identity KEYFILE")
    print(new_key(Path(sys.argv[1])))
