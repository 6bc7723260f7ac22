package ratelimit

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"

	"github.com/sluicekit/sluice/internal/keyspace"
)

// digestMark starts the keys that boundKey replaced by a digest.
const digestMark = "~#"

// boundKey returns the key a request-facing layer (the middlewares, Checker)
// counts a client's key under: the key itself, or, for a key longer than limit
// bytes or one that starts with digestMark, digestMark followed by the
// base64url SHA-256 of the key (45 bytes).
//
// The key often comes from the client (an API key header, gRPC metadata),
// and the Limiter refuses keys over keyspace.MaxNameLen with ErrInvalidKey.
// Passing such a key on would turn every request of that client into an
// error, which the default FallbackOpen serves unchecked: a client could
// switch its limit off with a long header while Redis is healthy. Digests
// are told apart from other keys by their mark, which no key keeps (a key
// that starts with it is digested too), so two clients share a count only
// if their keys collide under SHA-256.
func boundKey(key string, limit int) string {
	if len(key) <= limit && !strings.HasPrefix(key, digestMark) {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return digestMark + base64.RawURLEncoding.EncodeToString(sum[:])
}

// maxKeyLen is the longest key the Limiter takes.
const maxKeyLen = keyspace.MaxNameLen
