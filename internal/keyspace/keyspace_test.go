package keyspace

import (
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSlot(t *testing.T) {
	// Reference values from the Redis Cluster specification and redis-cli
	// CLUSTER KEYSLOT on redis 7.0.
	tests := []struct {
		key  string
		want uint16
	}{
		{"123456789", 12739}, // crc16 check value 0x31C3 mod 16384
		{"foo", 12182},
		{"{user1000}.following", 3443},
		{"{user1000}.followers", 3443},
		{"foo{}{bar}", 8363},    // empty tag: the whole key is hashed
		{"foo{{bar}}zap", 4015}, // tag is "{bar"
		{"foo{bar}{zap}", 5061}, // first tag only: "bar"
		{"bar", 5061},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			if got := Slot(tt.key); got != tt.want {
				t.Errorf("Slot(%q) = %d, want %d", tt.key, got, tt.want)
			}
		})
	}
}

func TestKeySharesSlot(t *testing.T) {
	for _, name := range []string{"order:42", "a}b", "{x}", "}", "}}a", "~}", "{", "\x00\xff", strings.Repeat("n", MaxNameLen)} {
		base := Slot(Key("sluice:mutex:", name, ""))
		for _, suffix := range []string{":q", ":f", ":x"} {
			if got := Slot(Key("sluice:mutex:", name, suffix)); got != base {
				t.Errorf("name %q suffix %q: slot %d, want %d", name, suffix, got, base)
			}
		}
	}
}

func TestCheck(t *testing.T) {
	if err := CheckName(""); !errors.Is(err, ErrEmptyName) {
		t.Errorf("CheckName(\"\") = %v, want ErrEmptyName", err)
	}
	if err := CheckName(strings.Repeat("x", MaxNameLen+1)); !errors.Is(err, ErrLongName) {
		t.Errorf("CheckName(long) = %v, want ErrLongName", err)
	}
	if err := CheckName("{ok}"); err != nil {
		t.Errorf("CheckName({ok}) = %v, want nil", err)
	}
	for _, p := range []string{"a{", "}", "x{y}"} {
		if err := CheckPrefix(p); !errors.Is(err, ErrBadPrefix) {
			t.Errorf("CheckPrefix(%q) = %v, want ErrBadPrefix", p, err)
		}
	}
	if err := CheckPrefix("sluice:"); err != nil {
		t.Errorf("CheckPrefix(sluice:) = %v", err)
	}
}

func TestKeyDistinct(t *testing.T) {
	names := []string{"}", "~}", "~~}", "~", "a", "}a", "~}a", "a}", "a}:q"}
	seen := map[string]string{}
	for _, n := range names {
		for _, suffix := range []string{"", ":q", ":f"} {
			k := Key("p:", n, suffix)
			if prev, ok := seen[k]; ok {
				t.Errorf("Key(%q, %q) = %q, same as %s", n, suffix, k, prev)
			}
			seen[k] = n + " " + suffix
		}
	}
}

// FuzzKey: for any name, every key of one instance hashes to one cluster
// slot, and two different names never give the same key.
func FuzzKey(f *testing.F) {
	for _, s := range []string{"order:42", "}", "{", "~}", "}{", "a}b", "\x00"} {
		f.Add(s, s+"x")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		if CheckName(a) != nil {
			return // refused before any key is built
		}
		base := Slot(Key("p:", a, ""))
		for _, suffix := range []string{":w", ":e", ":f", ":s", ":g", ":q"} {
			if got := Slot(Key("p:", a, suffix)); got != base {
				t.Fatalf("name %q: suffix %q in slot %d, base in %d", a, suffix, got, base)
			}
		}
		if got := NameOf(Key("p:", a, ""), "p:"); got != a {
			t.Fatalf("NameOf(Key(%q)) = %q", a, got)
		}
		if got := string(AppendKey([]byte("x"), "p:", a, ":q")); got != "x"+Key("p:", a, ":q") {
			t.Fatalf("AppendKey(%q) = %q, want x + Key", a, got)
		}
		if a != b && Key("p:", a, "") == Key("p:", b, "") {
			t.Fatalf("names %q and %q give the same key", a, b)
		}
	})
}
