// Command modproxy writes a file-based Go module proxy (GOPROXY=file://DIR)
// that serves every module of this repository at one release version, made
// from the working tree. CI uses it to check the modules the way an outside
// user meets them once they are tagged: fetched through a proxy, with no
// go.work and no replace directive.
//
//	go run . -root ../.. -version v0.1.0 -out /tmp/proxy
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

func main() {
	root := flag.String("root", ".", "repository root (holds go.work)")
	version := flag.String("version", "", "release version to serve every module at, for example v0.1.0")
	out := flag.String("out", "", "directory to write the proxy into")
	flag.Parse()
	if *version == "" || *out == "" {
		log.Fatal("modproxy: -version and -out are required")
	}
	data, err := os.ReadFile(filepath.Join(*root, "go.work"))
	if err != nil {
		log.Fatal(err)
	}
	work, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		log.Fatal(err)
	}
	for _, u := range work.Use {
		dir := filepath.Join(*root, u.Path)
		if err := serve(dir, *version, *out); err != nil {
			log.Fatalf("modproxy: %s: %v", u.Path, err)
		}
	}
}

// serve writes the list, .info, .mod and .zip files of the module in dir.
func serve(dir, version, out string) error {
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	path := modfile.ModulePath(gomod)
	if strings.Contains(path, "/internal/") {
		return nil // not for outside use; never published
	}
	mv := module.Version{Path: path, Version: version}
	escaped, err := module.EscapePath(path)
	if err != nil {
		return err
	}
	vdir := filepath.Join(out, escaped, "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(vdir, "list"), []byte(version+"\n"), 0o644); err != nil {
		return err
	}
	info, _ := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	if err := os.WriteFile(filepath.Join(vdir, version+".info"), info, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(vdir, version+".mod"), gomod, 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(vdir, version+".zip"))
	if err != nil {
		return err
	}
	// CreateFromDir leaves out nested modules, vendor directories and
	// version-control metadata, as the go command does for a tagged module.
	if err := zip.CreateFromDir(f, mv, dir); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Printf("served %s@%s\n", path, version)
	return nil
}
