package tui

import (
	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
)

// keyMap holds the key bindings, in the habits of k9s and nvitop.
type keyMap struct {
	Help, Quit, Next, Prev, Up, Down, PageUp, PageDown, Top, Bottom       key.Binding
	Open, Back, Filter, Stop, Restart, Screen1, Screen2, Screen3, Screen4 key.Binding
	Follow, NextMatch, PrevMatch, Edit, Add, Delete, Save, Apply, Yes, No key.Binding
	// The Nodes screen's.
	Retry, Accept key.Binding
	// The dashboard's.
	Wrap, Zoom, Window, EMA, Order, Report, Drop key.Binding
}

func newKeyMap() keyMap {
	b := func(keys []string, k, desc string) key.Binding {
		return key.NewBinding(key.WithKeys(keys...), key.WithHelp(k, desc))
	}
	return keyMap{
		Help:      b([]string{"?"}, "?", "help"),
		Quit:      b([]string{"q", "ctrl+c"}, "q", "quit (asks if a job runs)"),
		Next:      b([]string{"tab"}, "tab", "next pane"),
		Prev:      b([]string{"shift+tab"}, "shift+tab", "previous pane"),
		Up:        b([]string{"up", "k"}, "↑/k", "up"),
		Down:      b([]string{"down", "j"}, "↓/j", "down"),
		PageUp:    b([]string{"pgup", "ctrl+u"}, "pgup", "page up"),
		PageDown:  b([]string{"pgdown", "ctrl+d"}, "pgdn", "page down"),
		Top:       b([]string{"home", "g"}, "g", "top"),
		Bottom:    b([]string{"end", "G"}, "G", "bottom; follow the log"),
		Open:      b([]string{"enter"}, "enter", "open, edit, launch, apply"),
		Back:      b([]string{"esc"}, "esc", "back; clear the search"),
		Filter:    b([]string{"/"}, "/", "filter nodes; search log"),
		Stop:      b([]string{"s"}, "s", "stop the job (asks)"),
		Restart:   b([]string{"r"}, "r", "restart from checkpoint"),
		Screen1:   b([]string{"1"}, "1", "nodes"),
		Screen2:   b([]string{"2"}, "2", "rank table"),
		Screen3:   b([]string{"3"}, "3", "job"),
		Screen4:   b([]string{"4"}, "4", "dashboard"),
		Follow:    b([]string{"f"}, "f", "follow the log on/off"),
		NextMatch: b([]string{"n"}, "n", "next (older) match"),
		PrevMatch: b([]string{"N"}, "N", "previous (newer) match"),
		Edit:      b([]string{"e"}, "e", "job: edit the selected row"),
		Add:       b([]string{"a"}, "a", "job: add an -o override"),
		Delete:    b([]string{"d", "delete"}, "d", "job: delete an override"),
		Save:      b([]string{"w"}, "w", "rank table: write it"),
		Apply:     b([]string{"p"}, "p", "job: apply the plan"),
		Retry:     b([]string{"R"}, "R", "nodes: set the node up again"),
		Accept:    b([]string{"a"}, "a", "nodes: accept new host key"),
		Wrap:      b([]string{"W"}, "W", "log: wrap lines on/off"),
		Zoom:      b([]string{"z"}, "z", "pane full screen on/off"),
		Window:    b([]string{"l"}, "l", "loss: all/last 1000/200/50"),
		EMA:       b([]string{"e"}, "e", "loss: EMA on/off"),
		Order:     b([]string{"o"}, "o", "ranks: slowest first on/off"),
		Report:    b([]string{"w"}, "w", "dashboard: write report.png"),
		Drop:      b([]string{"D"}, "D", "drop a lost node, resume"),
		Yes:       b([]string{"y", "Y"}, "y", "yes"),
		No:        b([]string{"n", "N", "esc"}, "n", "no"),
	}
}

// helpGroups lists the bindings for the help screen, by topic.
func (k keyMap) helpGroups() [][]key.Binding {
	return [][]key.Binding{
		{k.Help, k.Quit, k.Screen1, k.Screen2, k.Screen3, k.Screen4, k.Next, k.Prev, k.Back},
		{k.Up, k.Down, k.PageUp, k.PageDown, k.Top, k.Bottom, k.Open, k.Filter},
		{k.Stop, k.Restart, k.Edit, k.Add, k.Delete, k.Save, k.Apply, k.Retry, k.Accept},
		{k.Follow, k.NextMatch, k.PrevMatch, k.Wrap, k.Zoom, k.Window, k.EMA, k.Order, k.Report, k.Drop},
	}
}

// is reports whether msg matches one of the bindings.
func is(msg tea.KeyPressMsg, b ...key.Binding) bool { return key.Matches(msg, b...) }
