//! Maintenance windows of a tenant cluster: parsing the specs an operator gives to
//! `lksctl cluster set NAME --maintenance-window SPEC` and answering whether a rollout may start
//! nodes now, and if not, when it next may.
//!
//! A spec is `DAYS START-END TZ`, three fields separated by ASCII whitespace, e.g.
//! `Sat,Sun 02:00-06:00 Europe/Berlin`:
//! - DAYS: comma-separated weekdays (`Mon` … `Sun` or full names, any case), ranges such as `Mon-Fri`
//!   or wrapping ones such as `Fri-Mon` (Fri, Sat, Sun, Mon), or `daily`.
//! - START-END: two-digit `HH:MM` (00:00 to 23:59); END may also be `24:00`. An END before START
//!   crosses midnight: the window opens on a listed day and closes on the next one, so
//!   `Sat 22:00-02:00 UTC` is open at 01:00 on Sunday although Sunday is not listed.
//! - TZ: an IANA zone name. It is looked up in the system database first (kept current by the OS)
//!   and then in the copy jiff embeds (feature `tzdb-bundle-always`), so a host with a missing or
//!   stale `/usr/share/zoneinfo` still knows every zone.
//!
//! Instants are Unix milliseconds so that callers need not know jiff. A cluster without windows
//! is always open; otherwise it is open while any of its windows is, start inclusive, end
//! exclusive.
//!
//! # Daylight saving time
//!
//! For a listed local day D a window runs from START on D to END on D (on D+1 when it crosses
//! midnight; `24:00` is 00:00 on D+1). Both are wall-clock times in TZ, turned into instants by
//! jiff's rules for the zone with "compatible" disambiguation, never by a hand-made offset table:
//! - a time skipped by a spring-forward gap is moved later by the length of the gap;
//! - a time that occurs twice in a fall-back fold is its earlier occurrence;
//! - a day whose end instant is not after its start instant has no window at all.
//!
//! So in Europe/Berlin in 2026:
//! - on 2026-03-29 (02:00 CET becomes 03:00 CEST) `Sun 02:00-03:00` is empty, both ends being
//!   03:00 CEST = 01:00 UTC; `Sun 01:00-04:00` lasts 2 real hours; `Sun 02:30-05:00` opens at
//!   03:30 CEST;
//! - on 2026-10-25 (03:00 CEST becomes 02:00 CET) `Sun 02:00-03:00` lasts 2 real hours, 00:00 to
//!   02:00 UTC: it opens at the first 02:00 and 03:00 only comes after the repeated hour.
//!
//! A window that ends inside a fold closes in its first pass: `Sat 23:00-01:30 America/New_York`
//! closes on 2026-11-01 at 01:30 EDT, an hour before the clocks show 01:30 again.

use std::fmt;
use std::str::FromStr;

use jiff::civil::{Date, Time};
use jiff::tz::{TimeZone, TimeZoneDatabase};
use jiff::{SignedDuration, Timestamp};

const ALL_DAYS: u8 = 0x7f;
const MINUTES_PER_DAY: u16 = 24 * 60;
/// Local days before today whose window may still be open now: one for crossing midnight and one
/// because a skipped calendar day (Pacific/Apia lost 2011-12-30) can push an end a day later.
const DAYS_BACK: usize = 2;
/// How far `next_open` looks: each weekday comes three times, so even if DST empties one of its
/// windows the next one is found.
const DAYS_AHEAD: usize = 22;
/// Spelled out in full; the first three letters are the short name.
const DAY_NAMES: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Why a maintenance window spec was rejected. The first field is always the spec as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    #[error(
        "maintenance window {0:?}: expected \"DAYS HH:MM-HH:MM TIMEZONE\", \
         e.g. \"Sat,Sun 02:00-06:00 Europe/Berlin\""
    )]
    Format(String),
    #[error(
        "maintenance window {0:?}: unknown weekday {1:?} \
         (use Mon, Tue, Wed, Thu, Fri, Sat, Sun or a range like Mon-Fri)"
    )]
    UnknownDay(String, String),
    #[error("maintenance window {0:?}: empty entry in the days list (e.g. Sat,Sun or Mon-Fri or daily)")]
    EmptyDays(String),
    #[error("maintenance window {0:?}: {1:?} is not a time, use two-digit HH:MM such as 02:00")]
    BadTime(String, String),
    #[error("maintenance window {0:?}: hour {1:02} is out of range (00-23)")]
    HourOutOfRange(String, u8),
    #[error("maintenance window {0:?}: minute {1:02} is out of range (00-59)")]
    MinuteOutOfRange(String, u8),
    #[error("maintenance window {0:?}: 24:00 can only end a window, start at 00:00 instead")]
    StartAt24(String),
    #[error("maintenance window {0:?}: empty range {1}")]
    EmptyRange(String, String),
    #[error("maintenance window {0:?}: unknown time zone {1:?}")]
    UnknownZone(String, String),
}

/// One parsed maintenance window; `Display` gives its canonical spec.
#[derive(Debug, Clone)]
pub struct Window {
    /// Bit i set: the window opens on weekday i, 0 being Monday.
    days: u8,
    /// Minutes after local midnight, 0..1440.
    start: u16,
    /// Minutes after local midnight, 1..=1440; below `start` means on the next day.
    end: u16,
    tz: TimeZone,
    /// The zone's canonical IANA name, which also stands for its rules in `==`.
    tz_name: String,
}

impl PartialEq for Window {
    fn eq(&self, other: &Self) -> bool {
        (self.days, self.start, self.end, &self.tz_name)
            == (other.days, other.start, other.end, &other.tz_name)
    }
}

impl Eq for Window {}

impl Window {
    /// The canonical spec, the same as `Display`.
    pub fn spec(&self) -> String {
        self.to_string()
    }

    /// The instants `[start, end)` of the window opening on local `day`, if it opens that day and
    /// DST leaves it non-empty.
    fn occurrence(&self, day: Date) -> Option<(i64, i64)> {
        let weekday = day.weekday().to_monday_zero_offset();
        if self.days & (1 << weekday) == 0 {
            return None;
        }
        let end = self.end + if self.end < self.start { MINUTES_PER_DAY } else { 0 };
        let (start, end) = (self.instant(day, self.start)?, self.instant(day, end)?);
        (start < end).then_some((start, end))
    }

    /// The instant `minutes` of wall-clock time after local midnight on `day`. The minutes are
    /// added to the civil date-time, so 24:00 and times past midnight fall on the next day.
    fn instant(&self, day: Date, minutes: u16) -> Option<i64> {
        let offset = SignedDuration::from_mins(i64::from(minutes));
        let civil = day.to_datetime(Time::midnight()).checked_add(offset).ok()?;
        let ts = self.tz.to_ambiguous_timestamp(civil).compatible().ok()?;
        Some(ts.as_millisecond())
    }

    /// Occurrences opening from `DAYS_BACK` local days before `now` to `ahead` days after it.
    fn occurrences(&self, now: Timestamp, ahead: usize) -> impl Iterator<Item = (i64, i64)> + '_ {
        let today = self.tz.to_datetime(now).date();
        let first = (0..DAYS_BACK).try_fold(today, |day, _| day.yesterday()).ok();
        std::iter::successors(first, |day| day.tomorrow().ok())
            .take(DAYS_BACK + 1 + ahead)
            .filter_map(move |day| self.occurrence(day))
    }
}

impl FromStr for Window {
    type Err = WindowError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let format = || WindowError::Format(spec.to_owned());
        let fields: Vec<&str> = spec.split_ascii_whitespace().collect();
        let [days, range, zone] = fields[..] else {
            return Err(format());
        };
        let days = parse_days(spec, days)?;
        let (start, end) = range.split_once('-').ok_or_else(format)?;
        let (start, end) = (parse_time(spec, start, false)?, parse_time(spec, end, true)?);
        if start == end {
            return Err(WindowError::EmptyRange(spec.to_owned(), range.to_owned()));
        }
        // An end of 00:00 is the same instant as 24:00; one spelling keeps `==` and Display honest.
        let end = if end == 0 { MINUTES_PER_DAY } else { end };
        let (tz, tz_name) = lookup_zone(spec, zone)?;
        Ok(Window {
            days,
            start,
            end,
            tz,
            tz_name,
        })
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.days == ALL_DAYS {
            f.write_str("daily")?;
        } else {
            let mut separator = "";
            for (i, name) in DAY_NAMES.iter().enumerate() {
                if self.days & (1 << i) != 0 {
                    write!(f, "{separator}{}", &name[..3])?;
                    separator = ",";
                }
            }
        }
        write!(f, " {}-{} {}", hhmm(self.start), hhmm(self.end), self.tz_name)
    }
}

fn hhmm(minute: u16) -> String {
    format!("{:02}:{:02}", minute / 60, minute % 60)
}

fn parse_days(spec: &str, field: &str) -> Result<u8, WindowError> {
    let mut mask = 0u8;
    for item in field.split(',') {
        if item.is_empty() {
            return Err(WindowError::EmptyDays(spec.to_owned()));
        }
        if item.eq_ignore_ascii_case("daily") {
            mask = ALL_DAYS;
            continue;
        }
        let day = |name: &str| {
            // "Mon-" has nothing to name on its right; the whole item says more.
            let shown = if name.is_empty() { item } else { name };
            weekday_index(name).ok_or_else(|| WindowError::UnknownDay(spec.to_owned(), shown.to_owned()))
        };
        let (from, to) = item.split_once('-').unwrap_or((item, item));
        let (mut d, to) = (day(from)?, day(to)?);
        mask |= 1 << d;
        while d != to {
            d = (d + 1) % 7;
            mask |= 1 << d;
        }
    }
    Ok(mask)
}

fn weekday_index(name: &str) -> Option<u8> {
    (0u8..7).find(|&i| {
        let full = DAY_NAMES[usize::from(i)];
        name.eq_ignore_ascii_case(full) || name.eq_ignore_ascii_case(&full[..3])
    })
}

/// Minutes after midnight for `HH:MM`; `24:00` (1440) only where `is_end`.
fn parse_time(spec: &str, text: &str, is_end: bool) -> Result<u16, WindowError> {
    let bad = || WindowError::BadTime(spec.to_owned(), text.to_owned());
    let digits =
        |hi: u8, lo: u8| (hi.is_ascii_digit() && lo.is_ascii_digit()).then(|| (hi - b'0') * 10 + (lo - b'0'));
    let [h1, h2, b':', m1, m2] = *text.as_bytes() else {
        return Err(bad());
    };
    let (hour, minute) = digits(h1, h2).zip(digits(m1, m2)).ok_or_else(bad)?;
    match (hour, minute) {
        (_, 60..) => Err(WindowError::MinuteOutOfRange(spec.to_owned(), minute)),
        (24, 0) if is_end => Ok(MINUTES_PER_DAY),
        (24, 0) => Err(WindowError::StartAt24(spec.to_owned())),
        (24.., _) => Err(WindowError::HourOutOfRange(spec.to_owned(), hour)),
        _ => Ok(u16::from(hour) * 60 + u16::from(minute)),
    }
}

fn lookup_zone(spec: &str, name: &str) -> Result<(TimeZone, String), WindowError> {
    let unknown = || WindowError::UnknownZone(spec.to_owned(), name.to_owned());
    let tz = jiff::tz::db()
        .get(name)
        .or_else(|_| TimeZoneDatabase::bundled().get(name))
        .map_err(|_| unknown())?;
    // jiff answers "Etc/Unknown" with a zone that has no IANA name and no rules to schedule by.
    let canonical = tz.iana_name().ok_or_else(unknown)?.to_owned();
    Ok((tz, canonical))
}

/// Parses every spec; the first bad one is the error.
pub fn parse_all(specs: &[String]) -> Result<Vec<Window>, WindowError> {
    specs.iter().map(|spec| spec.parse()).collect()
}

/// True if no windows are given, or `now_ms` lies in one of them (start inclusive, end exclusive).
pub fn is_open(windows: &[Window], now_ms: i64) -> bool {
    windows.is_empty() || closes_at(windows, now_ms).is_some()
}

/// The earliest instant at or after `now_ms` at which some window is open: `now_ms` itself if
/// one is open now. `None` if there are no windows (or `now_ms` is outside jiff's years
/// -9999..=9999).
pub fn next_open(windows: &[Window], now_ms: i64) -> Option<i64> {
    if windows.is_empty() {
        return None;
    }
    if is_open(windows, now_ms) {
        return Some(now_ms);
    }
    let now = Timestamp::from_millisecond(now_ms).ok()?;
    // Closed now, so every window that opened at or before now has already closed.
    let starts = windows
        .iter()
        .flat_map(|w| w.occurrences(now, DAYS_AHEAD))
        .map(|(start, _)| start);
    starts.filter(|&start| start > now_ms).min()
}

/// When the windows open at `now_ms` close: the latest end among them (a window that opens as
/// another closes is not followed). `None` if none is open or there are no windows.
pub fn closes_at(windows: &[Window], now_ms: i64) -> Option<i64> {
    let now = Timestamp::from_millisecond(now_ms).ok()?;
    let occurrences = windows.iter().flat_map(|w| w.occurrences(now, 0));
    occurrences
        .filter(|&(start, end)| start <= now_ms && now_ms < end)
        .map(|(_, end)| end)
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(rfc3339: &str) -> i64 {
        rfc3339.parse::<Timestamp>().unwrap().as_millisecond()
    }

    fn err(spec: &str) -> WindowError {
        spec.parse::<Window>().unwrap_err()
    }

    #[rustfmt::skip]
    const GOOD: &[(&str, &str)] = &[
        ("Sat 02:00-06:00 UTC", "Sat 02:00-06:00 UTC"),
        ("Sun,Sat 02:00-06:00 Europe/Berlin", "Sat,Sun 02:00-06:00 Europe/Berlin"),
        ("Mon-Fri 22:00-24:00 America/New_York", "Mon,Tue,Wed,Thu,Fri 22:00-24:00 America/New_York"),
        ("Fri-Mon 01:00-02:00 UTC", "Mon,Fri,Sat,Sun 01:00-02:00 UTC"),
        ("Sun-Sun 01:00-02:00 UTC", "Sun 01:00-02:00 UTC"),
        ("Tue-Mon 00:00-24:00 UTC", "daily 00:00-24:00 UTC"),
        ("daily 23:00-01:30 Etc/UTC", "daily 23:00-01:30 Etc/UTC"),
        ("DAILY,Mon 10:00-11:00 UTC", "daily 10:00-11:00 UTC"),
        ("Monday,saturday,SUN,sun 10:00-11:00 utc", "Mon,Sat,Sun 10:00-11:00 UTC"),
        ("  wed\t08:15-09:45   europe/berlin ", "Wed 08:15-09:45 Europe/Berlin"),
        ("Thursday-Fri 12:00-00:00 Australia/Lord_Howe", "Thu,Fri 12:00-24:00 Australia/Lord_Howe"),
    ];

    #[test]
    fn parses_good_specs_into_canonical_form() {
        for &(spec, canonical) in GOOD {
            let w: Window = spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"));
            assert_eq!(w.to_string(), canonical, "{spec}");
            assert_eq!(w.spec(), canonical);
            assert_eq!(canonical.parse::<Window>().unwrap(), w, "{spec}");
        }
        let w: Window = "Sat 22:00-02:00 UTC".parse().unwrap();
        assert_eq!((w.days, w.start, w.end), (1 << 5, 22 * 60, 2 * 60));
        assert_ne!(w, "Sat 22:00-02:00 Europe/Berlin".parse().unwrap());
        let specs: Vec<String> = GOOD.iter().map(|(spec, _)| spec.to_string()).collect();
        assert_eq!(parse_all(&specs).unwrap().len(), GOOD.len());
        assert_eq!(parse_all(&[]).unwrap(), vec![]);
    }

    #[rustfmt::skip]
    const BAD: &[(&str, &str)] = &[
        ("Sat 25:00-06:00 UTC", "hour 25 is out of range (00-23)"),
        ("Sat 02:00-24:30 UTC", "hour 24 is out of range (00-23)"),
        ("Sat 24:00-06:00 UTC", "24:00 can only end a window, start at 00:00 instead"),
        ("Sat 12:60-13:00 UTC", "minute 60 is out of range (00-59)"),
        ("Sat 2:00-06:00 UTC", "\"2:00\" is not a time, use two-digit HH:MM such as 02:00"),
        ("Sat 02:00-6:00 UTC", "\"6:00\" is not a time, use two-digit HH:MM such as 02:00"),
        ("Mon 0200-0600 UTC", "\"0200\" is not a time, use two-digit HH:MM such as 02:00"),
        ("Sat 02:0a-06:00 UTC", "\"02:0a\" is not a time, use two-digit HH:MM such as 02:00"),
        ("Sat 02:00-06:00:00 UTC", "\"06:00:00\" is not a time, use two-digit HH:MM such as 02:00"),
        ("Sat -06:00 UTC", "\"\" is not a time, use two-digit HH:MM such as 02:00"),
        ("Sax 02:00-06:00 UTC", UNKNOWN_SAX),
        (", 02:00-06:00 UTC", EMPTY_DAYS),
        ("Mon, 02:00-06:00 UTC", EMPTY_DAYS),
        ("Mon,,Tue 02:00-06:00 UTC", EMPTY_DAYS),
        ("Sat 02:00-06:00 Europe/Berln", "unknown time zone \"Europe/Berln\""),
        ("Sat 02:00-06:00 Etc/Unknown", "unknown time zone \"Etc/Unknown\""),
        ("Sat 02:00-06:00 +02:00", "unknown time zone \"+02:00\""),
        ("Sat 02:00-06:00 CEST", "unknown time zone \"CEST\""),
        ("Sat 02:00-06:00 ../../etc/passwd", "unknown time zone \"../../etc/passwd\""),
        ("Sat 02:00-06:00 /usr/share/zoneinfo/UTC", "unknown time zone \"/usr/share/zoneinfo/UTC\""),
        ("Sat 02:00-02:00 UTC", "empty range 02:00-02:00"),
        ("Sat 00:00-00:00 UTC", "empty range 00:00-00:00"),
        ("", FORMAT),
        ("  \t ", FORMAT),
        ("Sat 02:00-06:00", FORMAT),
        ("Sat,Sun 02:00-06:00 Europe/Berlin extra", FORMAT),
        ("Sat, Sun 02:00-06:00 UTC", FORMAT),
        ("Sat 02:00 UTC", FORMAT),
    ];
    const UNKNOWN_SAX: &str =
        "unknown weekday \"Sax\" (use Mon, Tue, Wed, Thu, Fri, Sat, Sun or a range like Mon-Fri)";
    const EMPTY_DAYS: &str = "empty entry in the days list (e.g. Sat,Sun or Mon-Fri or daily)";
    const FORMAT: &str = "expected \"DAYS HH:MM-HH:MM TIMEZONE\", e.g. \"Sat,Sun 02:00-06:00 Europe/Berlin\"";

    #[test]
    fn rejects_bad_specs_with_a_precise_error() {
        for &(spec, why) in BAD {
            assert_eq!(
                err(spec).to_string(),
                format!("maintenance window {spec:?}: {why}")
            );
        }
        let s = |text: &str| text.to_owned();
        assert_eq!(err("Sax 1 2"), WindowError::UnknownDay(s("Sax 1 2"), s("Sax")));
        for (spec, day) in [
            ("Mon-Fry 02:00-06:00 UTC", "Fry"),
            ("Mon- 02:00-06:00 UTC", "Mon-"),
            ("Mo 1 2", "Mo"),
        ] {
            assert_eq!(err(spec), WindowError::UnknownDay(s(spec), s(day)));
        }
        assert_eq!(
            err("Sat 12:99-13:00 UTC"),
            WindowError::MinuteOutOfRange(s("Sat 12:99-13:00 UTC"), 99)
        );
        let specs = ["Sat 02:00-06:00 UTC", "Sun 9:00-10:00 UTC", "Sax 1 2"].map(String::from);
        assert_eq!(parse_all(&specs).unwrap_err(), err("Sun 9:00-10:00 UTC"));
    }

    /// Per spec, rows of (now, next_open, closes_at at now): open at now iff next_open is now.
    type Timeline = &'static [(
        &'static str,
        &'static [(&'static str, &'static str, Option<&'static str>)],
    )];

    fn check(timeline: Timeline) {
        for &(spec, rows) in timeline {
            let w = vec![spec.parse::<Window>().unwrap()];
            for &(now, next, close) in rows {
                let at = ms(now);
                assert_eq!(
                    next_open(&w, at),
                    Some(ms(next)),
                    "next_open of {spec:?} at {now}"
                );
                assert_eq!(is_open(&w, at), next == now, "is_open of {spec:?} at {now}");
                assert_eq!(closes_at(&w, at), close.map(ms), "closes_at of {spec:?} at {now}");
            }
        }
    }

    /// 2026-06-06 is a Saturday.
    #[rustfmt::skip]
    const UTC: Timeline = &[
        ("Sat 02:00-06:00 UTC", &[
            ("2026-06-06T03:00:00Z", "2026-06-06T03:00:00Z", Some("2026-06-06T06:00:00Z")),
            ("2026-06-06T02:00:00Z", "2026-06-06T02:00:00Z", Some("2026-06-06T06:00:00Z")),
            ("2026-06-06T05:59:59.999Z", "2026-06-06T05:59:59.999Z", Some("2026-06-06T06:00:00Z")),
            ("2026-06-06T06:00:00Z", "2026-06-13T02:00:00Z", None),
            ("2026-06-06T01:59:59.999Z", "2026-06-06T02:00:00Z", None),
            ("2026-06-01T00:00:00Z", "2026-06-06T02:00:00Z", None),
            ("2026-06-07T03:00:00Z", "2026-06-13T02:00:00Z", None),
        ]),
        // Opened on Saturday, so still open early on Sunday; Friday night is not listed.
        ("Sat 22:00-02:00 UTC", &[
            ("2026-06-07T01:00:00Z", "2026-06-07T01:00:00Z", Some("2026-06-07T02:00:00Z")),
            ("2026-06-06T22:00:00Z", "2026-06-06T22:00:00Z", Some("2026-06-07T02:00:00Z")),
            ("2026-06-07T02:00:00Z", "2026-06-13T22:00:00Z", None),
            ("2026-06-06T21:59:00Z", "2026-06-06T22:00:00Z", None),
            ("2026-06-06T01:00:00Z", "2026-06-06T22:00:00Z", None),
        ]),
        ("Sat 22:00-24:00 UTC", &[
            ("2026-06-06T23:59:00Z", "2026-06-06T23:59:00Z", Some("2026-06-07T00:00:00Z")),
            ("2026-06-07T00:00:00Z", "2026-06-13T22:00:00Z", None),
        ]),
    ];

    #[test]
    fn utc_windows() {
        check(UTC);
    }

    /// 2026-03-29: 02:00 CET becomes 03:00 CEST at 01:00 UTC;
    /// 2026-10-25: 03:00 CEST becomes 02:00 CET at 01:00 UTC, so 02:00-03:00 happens twice.
    #[rustfmt::skip]
    const BERLIN: Timeline = &[
        // Empty on the spring-forward Sunday: both ends are 03:00 CEST.
        ("Sun 02:00-03:00 Europe/Berlin", &[
            ("2026-03-28T12:00:00Z", "2026-04-05T00:00:00Z", None),
            ("2026-03-29T00:59:00Z", "2026-04-05T00:00:00Z", None),
            ("2026-03-29T01:00:00Z", "2026-04-05T00:00:00Z", None),
            // Two real hours on the fall-back Sunday, through both passes of 02:30.
            ("2026-10-24T12:00:00Z", "2026-10-25T00:00:00Z", None),
            ("2026-10-25T00:00:00Z", "2026-10-25T00:00:00Z", Some("2026-10-25T02:00:00Z")),
            ("2026-10-25T01:30:00Z", "2026-10-25T01:30:00Z", Some("2026-10-25T02:00:00Z")),
            ("2026-10-25T02:00:00Z", "2026-11-01T01:00:00Z", None),
        ]),
        ("Sun 01:00-04:00 Europe/Berlin", &[
            ("2026-03-28T12:00:00Z", "2026-03-29T00:00:00Z", None),
            ("2026-03-29T00:00:00Z", "2026-03-29T00:00:00Z", Some("2026-03-29T02:00:00Z")),
            ("2026-03-29T02:00:00Z", "2026-04-04T23:00:00Z", None),
        ]),
        // 02:30 does not exist that day and is moved to 03:30 CEST.
        ("Sun 02:30-05:00 Europe/Berlin", &[
            ("2026-03-28T12:00:00Z", "2026-03-29T01:30:00Z", None),
            ("2026-03-29T01:30:00Z", "2026-03-29T01:30:00Z", Some("2026-03-29T03:00:00Z")),
        ]),
    ];

    #[test]
    fn berlin_dst() {
        check(BERLIN);
    }

    /// 2026-03-08: 02:00 EST becomes 03:00 EDT at 07:00 UTC;
    /// 2026-11-01: 02:00 EDT becomes 01:00 EST at 06:00 UTC, so 01:00-02:00 happens twice.
    #[rustfmt::skip]
    const NEW_YORK: Timeline = &[
        ("Sun 02:00-03:00 America/New_York", &[
            ("2026-03-07T12:00:00Z", "2026-03-15T06:00:00Z", None),
            ("2026-03-08T07:00:00Z", "2026-03-15T06:00:00Z", None),
        ]),
        ("Sun 01:00-04:00 America/New_York", &[
            ("2026-03-07T12:00:00Z", "2026-03-08T06:00:00Z", None),
            ("2026-03-08T06:00:00Z", "2026-03-08T06:00:00Z", Some("2026-03-08T08:00:00Z")),
        ]),
        ("Sun 01:00-02:00 America/New_York", &[
            ("2026-10-31T12:00:00Z", "2026-11-01T05:00:00Z", None),
            ("2026-11-01T05:00:00Z", "2026-11-01T05:00:00Z", Some("2026-11-01T07:00:00Z")),
            ("2026-11-01T06:30:00Z", "2026-11-01T06:30:00Z", Some("2026-11-01T07:00:00Z")),
        ]),
        // Ends at the first 01:30 (EDT); the second pass of 01:15 is already outside.
        ("Sat 23:00-01:30 America/New_York", &[
            ("2026-10-31T12:00:00Z", "2026-11-01T03:00:00Z", None),
            ("2026-11-01T03:00:00Z", "2026-11-01T03:00:00Z", Some("2026-11-01T05:30:00Z")),
            ("2026-11-01T06:15:00Z", "2026-11-08T04:00:00Z", None),
        ]),
    ];

    #[test]
    fn new_york_dst() {
        check(NEW_YORK);
    }

    /// Samoa skipped 2011-12-30: Thursday 23:59 at -10:00 was followed by Saturday 00:00 at +14:00,
    /// so Thursday's window ends (02:00 on the lost Friday, moved on by the gap) on Saturday.
    #[rustfmt::skip]
    const APIA: Timeline = &[
        ("Thu 22:00-02:00 Pacific/Apia", &[
            ("2011-12-30T11:00:00Z", "2011-12-30T11:00:00Z", Some("2011-12-30T12:00:00Z")),
            ("2011-12-30T12:00:00Z", "2012-01-05T08:00:00Z", None),
        ]),
    ];

    #[test]
    fn skipped_calendar_day() {
        check(APIA);
    }

    #[test]
    fn several_windows_and_none() {
        let now = ms("2026-06-06T03:00:00Z");
        assert!(is_open(&[], now));
        assert_eq!(next_open(&[], now), None);
        assert_eq!(closes_at(&[], now), None);

        // The Berlin one is 03:00-07:00 UTC in summer: the latest end among the open ones wins.
        let ws = ["Sat 02:00-06:00 UTC", "Sat 05:00-09:00 Europe/Berlin"].map(|s| s.parse().unwrap());
        let close = |t: &str| closes_at(&ws, ms(t));
        assert_eq!(close("2026-06-06T03:30:00Z"), Some(ms("2026-06-06T07:00:00Z")));
        assert_eq!(close("2026-06-06T02:30:00Z"), Some(ms("2026-06-06T06:00:00Z")));
        // Wednesday 01:00 in Tokyo is Tuesday 16:00 UTC, before Monday comes round again.
        let ws = ["Mon 09:00-10:00 UTC", "Wed 01:00-02:00 Asia/Tokyo"].map(|s| s.parse().unwrap());
        let next = |t: &str| next_open(&ws, ms(t));
        assert_eq!(next("2026-06-08T10:00:00Z"), Some(ms("2026-06-09T16:00:00Z")));
        assert_eq!(next("2026-06-01T08:00:00Z"), Some(ms("2026-06-01T09:00:00Z")));
        // Beyond the years jiff can represent nothing is open, and nothing panics.
        assert!(!is_open(&ws, i64::MAX));
        assert_eq!(next_open(&ws, i64::MIN), None);
    }

    const ZONES: [&str; 6] = [
        "UTC",
        "Europe/Berlin",
        "America/New_York",
        "Australia/Lord_Howe",
        "America/Santiago",
        "Asia/Kolkata",
    ];

    fn spec_strategy() -> impl Strategy<Value = String> {
        let zone = prop::sample::select(ZONES.to_vec());
        (1..=ALL_DAYS, 0..MINUTES_PER_DAY, 1..=MINUTES_PER_DAY, zone)
            .prop_filter("start == end is rejected", |(_, start, end, _)| start != end)
            .prop_map(|(days, start, end, zone)| {
                let names: Vec<&str> = (0..7)
                    .filter(|i| days & (1 << i) != 0)
                    .map(|i| DAY_NAMES[i])
                    .collect();
                format!("{} {}-{} {zone}", names.join(","), hhmm(start), hhmm(end))
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn next_open_is_the_first_open_instant(
            specs in prop::collection::vec(spec_strategy(), 1..4),
            base in ms("2020-01-01T00:00:00Z")..ms("2035-01-01T00:00:00Z"),
            near_transition in any::<bool>(),
            before_transition in 0i64..3 * 86_400_000,
        ) {
            let windows = parse_all(&specs).unwrap();
            for w in &windows {
                prop_assert_eq!(&w.spec().parse::<Window>().unwrap(), w);
            }
            // Half of the cases start shortly before a DST transition of the first window's zone.
            let now = match windows[0].tz.following(Timestamp::from_millisecond(base).unwrap()).next() {
                Some(t) if near_transition => t.timestamp().as_millisecond() - before_transition,
                _ => base,
            };
            let next = next_open(&windows, now).unwrap();
            prop_assert!(next >= now);
            prop_assert!(is_open(&windows, next));
            prop_assert_eq!(next == now, is_open(&windows, now));
            if next > now {
                for k in 0..=20 {
                    let t = now + (next - now) * k / 21;
                    prop_assert!(!is_open(&windows, t), "open at {} before next_open {}", t, next);
                }
                prop_assert!(!is_open(&windows, next - 1));
            }
            let close = closes_at(&windows, next).unwrap();
            prop_assert!(close > next);
            prop_assert!(is_open(&windows, close - 1));
            prop_assert_eq!(closes_at(&windows, now).is_some(), is_open(&windows, now));
        }
    }
}
