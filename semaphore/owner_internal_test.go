package semaphore

import (
	"testing"

	"github.com/google/uuid"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// TestOwnerID: a labelled permit id is a UUID, "/" and the label, which
// ownerOf reads back (labels may contain "/" themselves); a plain id has
// no label. Labelling costs the acquire path no allocation more than a
// plain id.
func TestOwnerID(t *testing.T) {
	plain, labelled := &Semaphore{}, &Semaphore{owner: "host-1/worker-7"}
	for _, c := range []struct {
		s     *Semaphore
		owner string
	}{{plain, ""}, {labelled, "host-1/worker-7"}} {
		id := c.s.newID()
		if _, err := uuid.Parse(id[:idLen]); err != nil {
			t.Fatalf("id %q does not start with a UUID: %v", id, err)
		}
		if got := ownerOf(id); got != c.owner {
			t.Fatalf("ownerOf(%q) = %q, want %q", id, got, c.owner)
		}
		if c.owner == "" && len(id) != idLen {
			t.Fatalf("plain id %q: %d bytes, want a bare UUID", id, len(id))
		}
	}
	if a, b := idAllocs(plain), idAllocs(labelled); b > a {
		t.Fatalf("a labelled id costs %v allocations, a plain one %v: want no more", b, a)
	}
}

// idAllocs is how many allocations one newID of s costs.
func idAllocs(s *Semaphore) float64 { return redistest.FewestAllocs(func() { _ = s.newID() }) }
