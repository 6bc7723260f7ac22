package main

import (
	"encoding/json"
	"fmt"
	"go/scanner"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// gremlinsVersion is the mutation tool that lists the Go mutants. It only
// lists them (unleash --dry-run): this runner applies each one to a
// scratch tree and picks the tests to run from per-test coverage.
const gremlinsVersion = "github.com/go-gremlins/gremlins/cmd/gremlins@v0.6.0"

// gremlinsFlags turns on, besides gremlins's defaults (arithmetic base,
// conditionals boundary and negation, increment/decrement, invert
// negatives), its optional operators that make sense here: && and ||
// swapped, break and continue swapped, += to -= and the like, x += y to
// x = y, and the bitwise ones.
var gremlinsFlags = []string{"--invert-logical", "--invert-loopctrl", "--invert-assignments",
	"--remove-self-assignments", "--invert-bitwise", "--invert-bwassign"}

// goPackages are the runtime packages whose Go is mutated: each a
// directory of the tree.
var goPackages = []string{"mutex", "semaphore", "ratelimit", "scriptcache", "goredis",
	"internal/lease", "internal/notify", "internal/scriptexec", "internal/keyspace"}

// gremlinsTokens is what each gremlins mutator makes of the token it
// names (gremlins's own table, for the tokens it reports).
var gremlinsTokens = map[string]map[token.Token]token.Token{
	"ARITHMETIC_BASE":       {token.ADD: token.SUB, token.MUL: token.QUO, token.QUO: token.MUL, token.REM: token.MUL, token.SUB: token.ADD},
	"CONDITIONALS_BOUNDARY": {token.GEQ: token.GTR, token.GTR: token.GEQ, token.LEQ: token.LSS, token.LSS: token.LEQ},
	"CONDITIONALS_NEGATION": {token.EQL: token.NEQ, token.GEQ: token.LSS, token.GTR: token.LEQ, token.LEQ: token.GTR, token.LSS: token.GEQ, token.NEQ: token.EQL},
	"INCREMENT_DECREMENT":   {token.DEC: token.INC, token.INC: token.DEC},
	"INVERT_ASSIGNMENTS":    {token.ADD_ASSIGN: token.SUB_ASSIGN, token.MUL_ASSIGN: token.QUO_ASSIGN, token.QUO_ASSIGN: token.MUL_ASSIGN, token.SUB_ASSIGN: token.ADD_ASSIGN},
	"INVERT_BITWISE":        {token.AND: token.OR, token.OR: token.AND, token.XOR: token.AND, token.AND_NOT: token.AND, token.SHL: token.SHR, token.SHR: token.SHL},
	"INVERT_BWASSIGN":       {token.AND_ASSIGN: token.OR_ASSIGN, token.OR_ASSIGN: token.AND_ASSIGN, token.XOR_ASSIGN: token.AND_ASSIGN, token.AND_NOT_ASSIGN: token.AND_ASSIGN, token.SHL_ASSIGN: token.SHR_ASSIGN, token.SHR_ASSIGN: token.SHL_ASSIGN},
	"INVERT_LOGICAL":        {token.LAND: token.LOR, token.LOR: token.LAND},
	"INVERT_LOOPCTRL":       {token.BREAK: token.CONTINUE, token.CONTINUE: token.BREAK},
	"INVERT_NEGATIVES":      {token.SUB: token.ADD},
	"REMOVE_SELF_ASSIGNMENTS": {token.ADD_ASSIGN: token.ASSIGN, token.AND_ASSIGN: token.ASSIGN, token.AND_NOT_ASSIGN: token.ASSIGN,
		token.MUL_ASSIGN: token.ASSIGN, token.OR_ASSIGN: token.ASSIGN, token.QUO_ASSIGN: token.ASSIGN, token.REM_ASSIGN: token.ASSIGN,
		token.SHL_ASSIGN: token.ASSIGN, token.SHR_ASSIGN: token.ASSIGN, token.SUB_ASSIGN: token.ASSIGN, token.XOR_ASSIGN: token.ASSIGN},
}

// gremlinsBinary installs gremlins into dir (once per scratch tree; the
// module cache keeps the download) and returns its path.
func gremlinsBinary(dir string) (string, error) {
	bin := filepath.Join(dir, "gremlins")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	cmd := exec.Command("go", "install", gremlinsVersion)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOWORK=off", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("installing gremlins: %w\n%s", err, out)
	}
	return bin, nil
}

// goMutants lists, with gremlins, the Go mutants of each package (a
// directory under tree). Gremlins gathers coverage first; GOFLAGS=-run=^$
// makes that a build with no test run (this runner measures coverage per
// test itself), and a workspace of the core and goredis only keeps it
// from fetching the other modules' dependencies.
func goMutants(tree, bin, work string, pkgs []string) ([]*Mutant, error) {
	var all []*Mutant
	for _, pkg := range pkgs {
		out := filepath.Join(work, "gremlins-"+strings.ReplaceAll(pkg, "/", "_")+".json")
		// The mutation build's own files are not runtime code.
		args := append([]string{"unleash", "--dry-run", "--silent", "-o", out, "-E", `_mutation\.go$`}, gremlinsFlags...)
		args = append(args, "./"+pkg)
		dir := tree
		if pkg == "goredis" {
			dir, args[len(args)-1] = filepath.Join(tree, "goredis"), "."
		}
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(tree, "mutation.work"), "GOFLAGS=-run=^$")
		if b, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("gremlins on %s: %w\n%s", pkg, err, b)
		}
		var res struct {
			Files []struct {
				Name      string `json:"file_name"`
				Mutations []struct {
					Type   string `json:"type"`
					Line   int    `json:"line"`
					Column int    `json:"column"`
				} `json:"mutations"`
			} `json:"files"`
		}
		b, err := os.ReadFile(out)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(b, &res); err != nil {
			return nil, fmt.Errorf("gremlins output %s: %w", out, err)
		}
		for _, f := range res.Files {
			rel := filepath.ToSlash(filepath.Join(pkg, f.Name))
			src, err := os.ReadFile(filepath.Join(tree, rel))
			if err != nil {
				return nil, err
			}
			toks := goTokens(src)
			keys := lineKeys(string(src))
			for _, m := range f.Mutations {
				t, ok := toks[[2]int{m.Line, m.Column}]
				if !ok {
					return nil, fmt.Errorf("%s:%d:%d: no token for %s", rel, m.Line, m.Column, m.Type)
				}
				to, ok := gremlinsTokens[m.Type][t.tok]
				if !ok {
					return nil, fmt.Errorf("%s:%d:%d: %s does not apply to %s", rel, m.Line, m.Column, m.Type, t.tok)
				}
				all = append(all, &Mutant{Lang: "go", File: rel, Line: m.Line, Col: m.Column,
					Op: strings.ToLower(m.Type), Start: t.off, End: t.off + len(t.tok.String()),
					Orig: t.tok.String(), Repl: to.String(),
					ID: mutantID(rel, keys, m.Line, m.Column, strings.ToLower(m.Type))})
			}
		}
	}
	return all, nil
}

type goTok struct {
	tok token.Token
	off int
}

// goTokens maps line and column to the operator tokens of a Go file.
func goTokens(src []byte) map[[2]int]goTok {
	fset := token.NewFileSet()
	file := fset.AddFile("x.go", -1, len(src))
	var s scanner.Scanner
	s.Init(file, src, nil, 0)
	m := map[[2]int]goTok{}
	for {
		pos, tok, _ := s.Scan()
		if tok == token.EOF {
			return m
		}
		p := fset.Position(pos)
		m[[2]int{p.Line, p.Column}] = goTok{tok, p.Offset}
	}
}
