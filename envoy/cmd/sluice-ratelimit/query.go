package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// descriptors is the repeatable -d flag: one descriptor, its entries
// key=value separated by commas.
type descriptors []*rlcommon.RateLimitDescriptor

func (d *descriptors) String() string { return fmt.Sprint(len(*d), " descriptors") }

func (d *descriptors) Set(s string) error {
	desc := &rlcommon.RateLimitDescriptor{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("entry %q: want key=value", kv)
		}
		desc.Entries = append(desc.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	*d = append(*d, desc)
	return nil
}

// query sends one ShouldRateLimit, as Envoy would, and prints the answer.
func query(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("query", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8081", "the service's gRPC `address`")
	domain := fs.String("domain", "example", "the request's domain")
	hits := fs.Uint("hits", 0, "hits_addend (0 means 1)")
	n := fs.Int("n", 1, "send the request this many times")
	var ds descriptors
	fs.Var(&ds, "d", "a descriptor, `key=value[,key=value...]`; repeat for more")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(ds) == 0 {
		return errors.New("no descriptor: give -d key=value")
	}
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	client := rlspb.NewRateLimitServiceClient(conn)
	for range *n {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := client.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: *domain, Descriptors: ds, HitsAddend: uint32(*hits)})
		cancel()
		if err != nil {
			return err
		}
		fmt.Fprintln(out, resp.GetOverallCode())
		for i, st := range resp.GetStatuses() {
			lim := "no limit"
			if l := st.GetCurrentLimit(); l != nil {
				lim = fmt.Sprintf("%d/%s", l.GetRequestsPerUnit(), strings.ToLower(l.GetUnit().String()))
			}
			fmt.Fprintf(out, "  %-40s %-10s %-14s remaining %d, reset in %v\n", describe(ds[i]), st.GetCode(), lim, st.GetLimitRemaining(), st.GetDurationUntilReset().AsDuration())
		}
	}
	return nil
}

func describe(d *rlcommon.RateLimitDescriptor) string {
	var parts []string
	for _, e := range d.GetEntries() {
		parts = append(parts, e.GetKey()+"="+e.GetValue())
	}
	return strings.Join(parts, ",")
}
