package main

import (
	"fmt"
	"sort"
	"strings"
	"testing"
)

// TestLuaMutants: the generator's mutants of a small script, by id: each
// operator where it applies, nothing in comments or strings, and ids that
// name file, line, column and operator (stable for a given text).
func TestLuaMutants(t *testing.T) {
	src := `-- header: if a < b then return 1 end (a comment, never mutated)
local h = redis.call('HMGET', KEYS[1], 'o', 'f')
if h[1] == ARGV[1] and not h[2] then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 1
end
local s = '<= ~= and'
if tonumber(ARGV[3]) > 2 then
  return 0
end
return -1
`
	ms, err := luaMutants("lua/x.lua", src)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, m := range ms {
		got[fmt.Sprintf("%s:%d:%d:%s", m.File, m.Line, m.Col, m.Op)] = m.Orig + " -> " + m.Repl
		if src[m.Start:m.End] != m.Orig {
			t.Errorf("%s: range holds %q, Orig %q", m.ID, src[m.Start:m.End], m.Orig)
		}
		if m.Line == 1 {
			t.Errorf("%s mutates the comment", m.ID)
		}
		if m.Line == 7 && m.Op != "key" {
			t.Errorf("%s mutates the string", m.ID)
		}
	}
	want := map[string]string{
		"lua/x.lua:2:36:key":    "1 -> 2",
		"lua/x.lua:2:40:field":  "'o' -> 'f'",
		"lua/x.lua:2:45:field":  "'f' -> 'o'",
		"lua/x.lua:3:1:if-not":  "h[1] == ARGV[1] and not h[2] -> not (h[1] == ARGV[1] and not h[2])",
		"lua/x.lua:3:6:index":   "1 -> 2",
		"lua/x.lua:3:9:eq":      "== -> ~=",
		"lua/x.lua:3:17:key":    "1 -> 2",
		"lua/x.lua:3:20:logic":  "and -> or",
		"lua/x.lua:3:24:not-rm": "not  -> ",
		"lua/x.lua:3:30:index":  "2 -> 3",
		"lua/x.lua:4:3:call-rm": "redis.call('PEXPIRE', KEYS[2], ARGV[2]) -> ",
		"lua/x.lua:4:30:key":    "2 -> 1",
		"lua/x.lua:4:39:key":    "2 -> 3",
		"lua/x.lua:5:10:ret":    "1 -> -1",
		"lua/x.lua:8:1:if-not":  "tonumber(ARGV[3]) > 2 -> not (tonumber(ARGV[3]) > 2)",
		"lua/x.lua:8:18:key":    "3 -> 2",
		"lua/x.lua:8:22:rel":    "> -> >=",
		"lua/x.lua:8:24:num+1":  "2 -> 3",
		"lua/x.lua:9:10:ret":    "0 -> 1",
		"lua/x.lua:11:9:ret":    "-1 -> 0",
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("%s = %q, want %q", id, got[id], w)
		}
	}
	var extra []string
	for id := range got {
		if _, ok := want[id]; !ok {
			extra = append(extra, id+" ("+got[id]+")")
		}
	}
	sort.Strings(extra)
	if len(extra) > 0 {
		t.Errorf("unexpected mutants:\n%s", strings.Join(extra, "\n"))
	}
}

// TestMutantIDsFollowLines checks that a mutant's id names its line by
// text: a line added above leaves every id as it was (so equivalent.txt
// keeps meaning), while a changed line gets new ids, and identical lines
// get distinct ones.
func TestMutantIDsFollowLines(t *testing.T) {
	src := "local a = redis.call('GET', KEYS[1])\nif a == ARGV[1] then return 1 end\nif a == ARGV[1] then return 1 end\n"
	ids := func(src string) map[string]bool {
		ms, err := luaMutants("lua/x.lua", src)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, m := range ms {
			if out[m.ID] {
				t.Fatalf("id %s twice", m.ID)
			}
			out[m.ID] = true
		}
		return out
	}
	before := ids(src)
	after := ids("-- a new first line\nlocal unused = 1\n" + src)
	for id := range before {
		if !after[id] {
			t.Errorf("id %s gone after lines were added above it", id)
		}
	}
	changed := ids(strings.Replace(src, "ARGV[1] then return 1 end\nif", "ARGV[2] then return 1 end\nif", 1))
	same := 0
	for id := range before {
		if changed[id] {
			same++
		}
	}
	if same == len(before) {
		t.Errorf("no id changed when a line changed")
	}
}
