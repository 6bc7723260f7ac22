package rls

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// ReadFiles reads the configuration files of paths: each path is a file,
// or a directory whose *.yaml and *.yml files (not those whose name starts
// with '.') are read in name order, without descending. A symbolic link is
// followed, so a Kubernetes ConfigMap's swapped ..data link reads the new
// files.
func ReadFiles(paths ...string) ([]File, error) {
	if len(paths) == 0 {
		return nil, fmt.Errorf("%w: no configuration path", ErrConfig)
	}
	var files []File
	for _, p := range paths {
		info, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		names := []string{p}
		if info.IsDir() {
			entries, err := os.ReadDir(p)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrConfig, err)
			}
			names = names[:0]
			for _, e := range entries {
				n := e.Name()
				if strings.HasPrefix(n, ".") || !(strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml")) {
					continue
				}
				names = append(names, filepath.Join(p, n))
			}
			slices.Sort(names)
		}
		for _, n := range names {
			b, err := os.ReadFile(n)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrConfig, err)
			}
			files = append(files, File{Name: n, Data: b})
		}
	}
	return files, nil
}

// Load reads and parses the configuration files of paths (see ReadFiles).
func Load(paths ...string) (*Config, error) {
	files, err := ReadFiles(paths...)
	if err != nil {
		return nil, err
	}
	return Parse(files...)
}

// DefaultInterval is how often a Watcher looks at its files when
// WatchOptions.Interval is 0.
const DefaultInterval = time.Second

// WatchOptions configures Watch. The zero value of each field means its
// default.
type WatchOptions struct {
	// Interval is how often the files are read and compared with the last
	// ones read. Default DefaultInterval.
	Interval time.Duration
	// OnLoad is called with each new configuration that parsed, the first
	// one included, from the Watcher's goroutine (the first from Watch's).
	// Default: nothing.
	OnLoad func(*Config)
	// OnError is called when changed files do not make a configuration;
	// the last good one stays in force. Default: nothing.
	OnError func(error)
}

// Watcher reloads a configuration when its files change. Close stops it.
type Watcher struct {
	paths []string
	opts  WatchOptions
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once

	mu      sync.Mutex
	sum     [sha256.Size]byte // of the files last read, good or bad
	good    *Config
	lastErr string // the error last told to OnError
}

// Watch loads the configuration of paths (see ReadFiles), which must
// parse, then reads the files again every Interval and reloads when any
// byte of them, or the list of files, changed. A configuration that does
// not parse goes to OnError and the last good one stays; it is tried again
// only once the files change again.
func Watch(paths []string, opts WatchOptions) (*Watcher, error) {
	if opts.Interval < 0 {
		return nil, fmt.Errorf("%w: negative Interval", ErrInvalidOptions)
	}
	if opts.Interval == 0 {
		opts.Interval = DefaultInterval
	}
	w := &Watcher{paths: slices.Clone(paths), opts: opts, stop: make(chan struct{}), done: make(chan struct{})}
	changed, err := w.Reload()
	if err != nil {
		return nil, err
	}
	if !changed {
		return nil, errors.New("rls: no configuration")
	}
	go w.run()
	return w, nil
}

// Config returns the last good configuration.
func (w *Watcher) Config() *Config {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.good
}

// Reload reads the files now and reports whether they changed and made a
// new configuration, which has then gone to OnLoad. An error is also given
// to OnError.
func (w *Watcher) Reload() (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	files, err := ReadFiles(w.paths...)
	var sum [sha256.Size]byte
	if err == nil {
		h := sha256.New()
		for _, f := range files {
			fmt.Fprintf(h, "%d:%s%d:", len(f.Name), f.Name, len(f.Data))
			h.Write(f.Data)
		}
		copy(sum[:], h.Sum(nil))
		if sum == w.sum && w.good != nil {
			return false, nil
		}
	}
	var cfg *Config
	if err == nil {
		cfg, err = Parse(files...)
	}
	if err != nil {
		w.sum = sum
		// Told once per new error, not once per poll.
		if msg := err.Error(); msg != w.lastErr {
			w.lastErr = msg
			if w.opts.OnError != nil && w.good != nil {
				w.opts.OnError(err)
			}
		}
		return false, err
	}
	w.sum, w.good, w.lastErr = sum, cfg, ""
	if w.opts.OnLoad != nil {
		w.opts.OnLoad(cfg)
	}
	return true, nil
}

func (w *Watcher) run() {
	defer close(w.done)
	t := time.NewTicker(w.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			w.Reload() //nolint:errcheck // told to OnError
		}
	}
}

// Close stops the Watcher and waits for its goroutine.
func (w *Watcher) Close() {
	w.once.Do(func() { close(w.stop) })
	<-w.done
}
