package main

import (
	"fmt"
	"regexp"
	"strings"

	"golang.org/x/mod/semver"
)

// A changelog is CHANGELOG.md in the Keep a Changelog layout: a "## [X.Y.Z]
// - DATE" heading for each release, newest first, under an optional
// "## [Unreleased]".
type changelog struct {
	sections []section
}

type section struct {
	version string // "v0.1.0"; "" for Unreleased
	heading string // the heading's line
	text    string // what is under the heading, up to the next "## "
}

var releaseHeading = regexp.MustCompile(`^## \[([^\]]+)\]`)

func parseChangelog(text string) (changelog, error) {
	var c changelog
	var cur *section
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "## ") {
			m := releaseHeading.FindStringSubmatch(line)
			if m == nil {
				return c, fmt.Errorf("CHANGELOG.md: heading %q: want \"## [X.Y.Z] - YYYY-MM-DD\" or \"## [Unreleased]\"", line)
			}
			s := section{heading: line}
			if !strings.EqualFold(m[1], "Unreleased") {
				s.version = "v" + m[1]
				if !semver.IsValid(s.version) || semver.Canonical(s.version) != s.version {
					return c, fmt.Errorf("CHANGELOG.md: heading %q: %q is not a version", line, m[1])
				}
			}
			c.sections = append(c.sections, s)
			cur = &c.sections[len(c.sections)-1]
			continue
		}
		if cur != nil {
			cur.text += line + "\n"
		}
	}
	return c, nil
}

// section is the text of the release at version, with ok false if the
// changelog has no heading for it.
func (c changelog) section(version string) (text string, ok bool) {
	for _, s := range c.sections {
		if s.version == version {
			return s.text, true
		}
	}
	return "", false
}

// previous is the newest release the changelog lists before version: the
// one whose API the candidate is compared with; "" if there is none.
func (c changelog) previous(version string) string {
	prev := ""
	for _, s := range c.sections {
		if s.version != "" && semver.Compare(s.version, version) < 0 && semver.Compare(s.version, prev) > 0 {
			prev = s.version
		}
	}
	return prev
}
