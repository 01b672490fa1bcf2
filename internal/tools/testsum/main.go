// Command testsum reads `go test -json` on its standard input, prints the
// output of what failed, and ends with a summary: packages and tests passed,
// failed and skipped, and every skipped test grouped by the reason it gave.
// It exits 1 when anything failed, so CI can pipe the tests through it:
//
//	go test -race -json ./... | go run ./internal/tools/testsum
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// event is one line of test2json's output.
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// result is what the summary needs of one test or package.
type result struct {
	output []string // its lines, kept until it ends
	reason string   // the last line it logged before a skip
}

// summary is what a run added up to.
type summary struct {
	pass, fail, skip             int
	pkgPass, pkgFail, pkgNoTests int
	failed                       []string
	skips                        map[string][]string // reason -> tests
}

func main() {
	s, err := read(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsum:", err)
		os.Exit(2)
	}
	s.print(os.Stdout)
	if s.fail > 0 || s.pkgFail > 0 {
		os.Exit(1)
	}
}

// read consumes the events, printing the output of each failed test and
// package to w as soon as it fails.
func read(r io.Reader, w io.Writer) (*summary, error) {
	s := &summary{skips: map[string][]string{}}
	live := map[string]*result{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// go test prints build errors as plain text before its JSON.
			fmt.Fprintln(w, sc.Text())
			continue
		}
		key := e.Package + " " + e.Test
		res := live[key]
		if res == nil {
			res = &result{}
			live[key] = res
		}
		switch e.Action {
		case "output":
			res.output = append(res.output, e.Output)
			if line := strings.TrimSpace(e.Output); line != "" && !strings.HasPrefix(line, "---") && !strings.HasPrefix(line, "===") {
				res.reason = line
			}
		case "pass", "fail", "skip":
			delete(live, key)
			s.add(e, res, w)
		}
	}
	return s, sc.Err()
}

func (s *summary) add(e event, res *result, w io.Writer) {
	name := e.Package
	if e.Test != "" {
		name += "." + e.Test
	}
	switch {
	case e.Test == "" && e.Action == "fail":
		s.pkgFail++
		s.failed = append(s.failed, name)
		fmt.Fprintf(w, "FAIL %s\n%s", name, strings.Join(res.output, ""))
	case e.Test == "" && e.Action == "skip":
		s.pkgNoTests++
	case e.Test == "":
		s.pkgPass++
	case e.Action == "pass":
		s.pass++
	case e.Action == "fail":
		s.fail++
		s.failed = append(s.failed, name)
		fmt.Fprintf(w, "FAIL %s\n%s", name, strings.Join(res.output, ""))
	case e.Action == "skip":
		s.skip++
		reason := res.reason
		if i := strings.Index(reason, ": "); i >= 0 && strings.Contains(reason[:i], "_test.go:") {
			reason = reason[i+2:] // drop the file:line prefix t.Skip adds
		}
		if reason == "" {
			reason = "(no reason given)"
		}
		s.skips[reason] = append(s.skips[reason], name)
	}
}

func (s *summary) print(w io.Writer) {
	fmt.Fprintf(w, "\npackages: %d ok, %d failed, %d without tests\n", s.pkgPass, s.pkgFail, s.pkgNoTests)
	fmt.Fprintf(w, "tests:    %d passed, %d failed, %d skipped\n", s.pass, s.fail, s.skip)
	if len(s.skips) > 0 {
		reasons := make([]string, 0, len(s.skips))
		for r := range s.skips {
			reasons = append(reasons, r)
		}
		sort.Slice(reasons, func(i, j int) bool {
			if a, b := len(s.skips[reasons[i]]), len(s.skips[reasons[j]]); a != b {
				return a > b
			}
			return reasons[i] < reasons[j]
		})
		fmt.Fprintln(w, "skipped, by reason:")
		for _, r := range reasons {
			tests := s.skips[r]
			shown := tests
			if len(shown) > 4 {
				shown = append(shown[:4:4], fmt.Sprintf("and %d more", len(tests)-4))
			}
			fmt.Fprintf(w, "  %3d  %s\n       %s\n", len(tests), r, strings.Join(shown, ", "))
		}
	}
	for _, f := range s.failed {
		fmt.Fprintln(w, "FAILED", f)
	}
}
