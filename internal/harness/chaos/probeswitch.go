package chaos

import "os"

// ProbesEnv, set to "off", runs the random workload and its oracle without
// the probes staged after it (the wake-ups, the seams, the late tries, the
// Policies probe): the mutation runner (internal/harness/mutation)
// measures what the random workload catches on its own that way.
const ProbesEnv = "SLUICE_CHAOS_PROBES"

func probesOn() bool { return os.Getenv(ProbesEnv) != "off" }
