package main

import (
	"strings"
	"testing"
)

// TestReportNamesTestPackages checks that the report names the packages
// whose tests ran: with -test-pkgs, only those, not every mutated one.
func TestReportNamesTestPackages(t *testing.T) {
	d := &reportData{Tests: 12, TestPkgs: []string{"mutex"}, Generated: map[string]int{}}
	text := d.markdown()
	if !strings.Contains(text, "12 tests in the test packages (mutex),") {
		t.Errorf("report does not name the test packages as run:\n%s", text)
	}
}
