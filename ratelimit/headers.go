package ratelimit

import (
	"net/http"
	"strings"
)

// The RateLimit-Policy and RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers are structured-field Lists with one
// member per policy, named by its first item. Middlewares stacked on one
// handler (NewMiddleware and NewConcurrencyMiddleware, in either order)
// each add their members to what the middlewares before them wrote, so
// that a response lists every policy that limited it, and its RateLimit
// members name policies that RateLimit-Policy lists.
//
// A policy name is listed once. A middleware that writes a member named
// like one already there replaces that policy in both fields: its own
// RateLimit-Policy member replaces the other, and the other's RateLimit
// member is dropped (or replaced by its own), so that a name's quota and
// its remaining figures always come from the same middleware. Give
// stacked middlewares different PolicyNames to see both.

// addPolicies adds to h the RateLimit-Policy members in policy and the
// RateLimit members in limit ("" for none), both lists of policies named
// by names (quoted), after the members that are there already, less any
// of those named in names.
func addPolicies(h http.Header, names []string, policy, limit string) {
	h[headerPolicy] = mergeMembers(h[headerPolicy], names, policy)
	if limit != "" || len(h[headerRateLimit]) > 0 {
		if v := mergeMembers(h[headerRateLimit], names, limit); v != nil {
			h[headerRateLimit] = v
		} else {
			delete(h, headerRateLimit)
		}
	}
}

// mergeMembers returns the field lines old, as one line, without the
// members named in names, followed by add (a list, or ""). It returns nil
// when nothing is left.
func mergeMembers(old []string, names []string, add string) []string {
	if len(old) == 0 {
		if add == "" {
			return nil
		}
		return []string{add}
	}
	var b strings.Builder
	for _, line := range old {
		for _, m := range splitMembers(line) {
			if containsName(names, memberName(m)) {
				continue
			}
			if b.Len() > 0 {
				b.WriteString(", ")
			}
			b.WriteString(m)
		}
	}
	if add != "" {
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(add)
	}
	if b.Len() == 0 {
		return nil
	}
	return []string{b.String()}
}

func containsName(names []string, name string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}

// splitMembers splits a structured-field List line at the commas outside
// quoted strings, trimming the spaces around each member and dropping
// empty ones.
func splitMembers(line string) []string {
	var members []string
	start, quoted := 0, false
	for i := 0; i < len(line); i++ {
		switch c := line[i]; {
		case quoted && c == '\\':
			i++ // the escaped byte
		case c == '"':
			quoted = !quoted
		case !quoted && c == ',':
			if m := strings.Trim(line[start:i], " \t"); m != "" {
				members = append(members, m)
			}
			start = i + 1
		}
	}
	if m := strings.Trim(line[start:], " \t"); m != "" {
		members = append(members, m)
	}
	return members
}

// memberName returns the item of a List member, its name: the member up to
// its first parameter (a ';' outside quotes).
func memberName(m string) string {
	quoted := false
	for i := 0; i < len(m); i++ {
		switch c := m[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == ';':
			return strings.TrimRight(m[:i], " \t")
		}
	}
	return m
}
