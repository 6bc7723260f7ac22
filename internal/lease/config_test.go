package lease

import (
	"testing"
	"time"
)

func TestConfigNormalize(t *testing.T) {
	tests := []struct {
		name         string
		in           Config
		wantErr      bool
		wantLease    time.Duration
		wantWatchdog bool
	}{
		{"zero is the default", Config{}, false, DefaultWatchdogLease, true},
		{"fixed lease", Config{Fixed: time.Second}, false, time.Second, false},
		{"custom watchdog", Config{Watchdog: 300 * time.Millisecond}, false, 300 * time.Millisecond, true},
		{"fixed below minimum", Config{Fixed: time.Millisecond}, true, 0, false},
		{"negative fixed", Config{Fixed: -time.Second}, true, 0, false},
		{"fixed above maximum", Config{Fixed: MaxLease + 1}, true, 0, false},
		{"negative watchdog", Config{Watchdog: -1}, true, 0, false},
		{"negative acks", Config{ReplicaAcks: -1}, true, 0, false},
		{"too many acks", Config{ReplicaAcks: 101}, true, 0, false},
		{"negative replica timeout", Config{ReplicaAcks: 1, ReplicaTimeout: -1}, true, 0, false},
		{"replica timeout too long", Config{ReplicaTimeout: time.Hour}, true, 0, false},
		// Every bound both ways: on it is allowed, one step past it is not.
		{"fixed at minimum", Config{Fixed: MinLease}, false, MinLease, false},
		{"fixed just below minimum", Config{Fixed: MinLease - 1}, true, 0, false},
		{"fixed at maximum", Config{Fixed: MaxLease}, false, MaxLease, false},
		{"watchdog at minimum", Config{Watchdog: MinLease}, false, MinLease, true},
		{"watchdog just below minimum", Config{Watchdog: MinLease - 1}, true, 0, false},
		{"watchdog at maximum", Config{Watchdog: MaxLease}, false, MaxLease, true},
		{"watchdog just above maximum", Config{Watchdog: MaxLease + 1}, true, 0, false},
		{"acks at maximum", Config{ReplicaAcks: maxReplicaAcks}, false, DefaultWatchdogLease, true},
		{"acks just above maximum", Config{ReplicaAcks: maxReplicaAcks + 1}, true, 0, false},
		{"replica timeout at maximum", Config{ReplicaTimeout: maxReplicaTimeout}, false, DefaultWatchdogLease, true},
		{"replica timeout just above maximum", Config{ReplicaTimeout: maxReplicaTimeout + 1}, true, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.in
			err := c.Normalize()
			if (err != nil) != tt.wantErr {
				t.Fatalf("Normalize() = %v, want error %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if c.ReplicaTimeout == 0 {
				t.Errorf("ReplicaTimeout left at zero, want the default")
			}
			lease, watchdog := c.Effective()
			if lease != tt.wantLease || watchdog != tt.wantWatchdog {
				t.Errorf("Effective() = %v, %v; want %v, %v", lease, watchdog, tt.wantLease, tt.wantWatchdog)
			}
		})
	}
}
