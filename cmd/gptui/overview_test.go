package main

import (
	"bufio"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// docPages are the pages the doc tests read, relative to the repository
// root.
func docPages(t *testing.T) (root string, pages []string) {
	t.Helper()
	root = filepath.Join(srcDir, "..", "..")
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil || len(docs) == 0 {
		t.Fatalf("no docs/*.md under %s (%v)", root, err)
	}
	pages = []string{"README.md"}
	for _, d := range docs {
		pages = append(pages, filepath.Join("docs", filepath.Base(d)))
	}
	return root, pages
}

// TestOverviewMapsEveryPackage: docs/overview.md's "How the code is
// organized" names every package of the module (each directory with a
// non-test .go file, testdata and hidden directories aside: what 'go list
// ./...' lists) as a list item "- `PATH` — ...", the root package as ".",
// and names no package that is not there; and every package has a
// package doc, which the item summarises.
func TestOverviewMapsEveryPackage(t *testing.T) {
	root, _ := docPages(t)
	pkgs := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (n == "testdata" || strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") && !buildIgnored(path) {
			rel, _ := filepath.Rel(root, filepath.Dir(path))
			pkgs[filepath.ToSlash(rel)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 10 {
		t.Fatalf("found %d packages under %s", len(pkgs), root)
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "overview.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "\n## How the code is organized\n")
	if i < 0 {
		t.Fatal(`docs/overview.md has no "## How the code is organized"`)
	}
	s = s[i+1:]
	if j := strings.Index(s, "\n## "); j >= 0 {
		s = s[:j]
	}
	named := map[string]bool{}
	item := regexp.MustCompile("(?m)^- `([a-z0-9_./-]+)` ")
	for _, m := range item.FindAllStringSubmatch(s, -1) {
		if named[m[1]] {
			t.Errorf("docs/overview.md names %s twice", m[1])
		}
		named[m[1]] = true
		if !pkgs[m[1]] {
			t.Errorf("docs/overview.md names %s, which is not a package of the module", m[1])
		}
	}
	var missing []string
	for p := range pkgs {
		if !named[p] {
			missing = append(missing, p)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("docs/overview.md's \"How the code is organized\" does not name %d package(s): %s", len(missing), strings.Join(missing, ", "))
	}
	for p := range pkgs {
		fset := token.NewFileSet()
		files, err := parser.ParseDir(fset, filepath.Join(root, p), func(fi fs.FileInfo) bool {
			return !strings.HasSuffix(fi.Name(), "_test.go")
		}, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		doc := false
		for _, pkg := range files {
			for _, f := range pkg.Files {
				doc = doc || (f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != "" && !strings.HasPrefix(f.Doc.Text(), "Code generated"))
			}
		}
		if !doc {
			t.Errorf("package %s has no package doc", p)
		}
	}
}

// buildIgnored reports whether a Go file is left out of every build
// ("//go:build ignore", as generators are), so that it makes no package.
func buildIgnored(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "//go:build ignore":
			return true
		case strings.HasPrefix(l, "package "):
			return false
		}
	}
	return false
}

// TestDocCommands: every command 'gptui help' lists is in the command
// tables of README.md and docs/overview.md and in cmd/gptui's package
// doc, so that none is left out of the pages a newcomer reads first.
func TestDocCommands(t *testing.T) {
	root, _ := docPages(t)
	code, out, e := runCLI(t, "help")
	if code != 0 {
		t.Fatalf("help: exit %d\n%s", code, e)
	}
	var names []string
	sc := bufio.NewScanner(strings.NewReader(out))
	in := false
	for sc.Scan() {
		l := sc.Text()
		switch {
		case l == "Commands:":
			in = true
		case in && l == "":
			in = false
		case in && len(l) > 2 && l[:2] == "  " && l[2] >= 'a' && l[2] <= 'z':
			if n := strings.Fields(l)[0]; !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	if len(names) < 10 {
		t.Fatalf("help lists %d commands: %q\n%s", len(names), names, out)
	}
	main, err := os.ReadFile(filepath.Join(srcDir, "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, page := range []string{"README.md", "docs/overview.md"} {
		b, err := os.ReadFile(filepath.Join(root, page))
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if !strings.Contains(string(b), "`gptui "+n) {
				t.Errorf("%s names no `gptui %s`", page, n)
			}
		}
	}
	// The usage lines of the package doc: "//\tgptui NAME ..." or a
	// "| NAME" of a line that lists several.
	for _, n := range names {
		re := regexp.MustCompile(`(?m)^//\tgptui ([^|\n]*\| )*` + regexp.QuoteMeta(n) + `\b`)
		if !re.Match(main) {
			t.Errorf("cmd/gptui's package doc (main.go) has no usage line for gptui %s", n)
		}
	}
}
