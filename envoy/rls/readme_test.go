package rls_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"                  // the types the snippet names
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"                     //
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3" //
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"                          //
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// TestReadmeEnvoySnippet parses the Envoy configuration of the Envoy
// page (docs/envoy.md) into Envoy's bootstrap types and runs their validation:
// every field name, type URL and value there is one Envoy takes.
func TestReadmeEnvoySnippet(t *testing.T) {
	b, err := os.ReadFile("../../docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	i := strings.Index(readme, "# Envoy: a rate limit service")
	if i < 0 {
		t.Fatal("no Envoy page in docs/envoy.md")
	}
	start := strings.Index(readme[i:], "```yaml\n")
	if start < 0 {
		t.Fatal("no yaml block in the Envoy section")
	}
	body := readme[i+start+len("```yaml\n"):]
	end := strings.Index(body, "```")
	if end < 0 {
		t.Fatal("the yaml block does not end")
	}
	body = body[:end]
	var v any
	if err := yaml.Unmarshal([]byte(body), &v); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var boot bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &boot); err != nil {
		t.Fatalf("the snippet is not an Envoy bootstrap: %v", err)
	}
	if err := boot.ValidateAll(); err != nil {
		t.Fatalf("Envoy's validation: %v", err)
	}
	if !strings.Contains(body, "cluster_name: sluice_ratelimit") || !strings.Contains(body, "port_value: 8081") {
		t.Fatal("the snippet does not point at the service")
	}
}
