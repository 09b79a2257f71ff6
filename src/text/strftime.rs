//! Python's `datetime.strftime` for chat templates (`strftime_now`): the
//! common directives over a Unix time in UTC, without a date-time dependency.

const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Formats a Unix time (UTC) with the common strftime directives, plus glibc's
/// `%-d` style unpadded numbers.
pub(super) fn format_utc(unix: i64, format: &str) -> Result<String, String> {
    let (days, secs) = (unix.div_euclid(86_400), unix.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next().ok_or("strftime_now: format ends with %")?;
        let pad = spec != '-';
        if !pad {
            spec = chars.next().ok_or("strftime_now: format ends with %-")?;
        }
        let num = |n: i64, width: usize| {
            if pad {
                format!("{n:0width$}")
            } else {
                n.to_string()
            }
        };
        let text = match spec {
            'Y' => year.to_string(),
            'y' => num(year.rem_euclid(100), 2),
            'm' => num(month, 2),
            'd' => num(day, 2),
            'e' => format!("{day:>2}"),
            'j' => num(yday, 3),
            'H' => num(hour, 2),
            'I' => num((hour + 11) % 12 + 1, 2),
            'M' => num(minute, 2),
            'S' => num(second, 2),
            'p' => (if hour < 12 { "AM" } else { "PM" }).into(),
            'A' => DAYS[weekday].into(),
            'a' => DAYS[weekday][..3].into(),
            'B' => MONTHS[month as usize - 1].into(),
            'b' | 'h' => MONTHS[month as usize - 1][..3].into(),
            'F' => format!("{year}-{month:02}-{day:02}"),
            'T' => format!("{hour:02}:{minute:02}:{second:02}"),
            'Z' => "UTC".into(),
            'z' => "+0000".into(),
            '%' => "%".into(),
            other => return Err(format!("strftime_now: unsupported directive %{other}")),
        };
        out.push_str(&text);
    }
    Ok(out)
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian
/// (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_like_python() {
        // 2024-07-26 09:05:03 UTC, a Friday: Python's strftime gives these.
        let t = 1_721_984_703;
        assert_eq!(format_utc(t, "%d %b %Y").unwrap(), "26 Jul 2024");
        assert_eq!(
            format_utc(t, "%A %B %-d, %Y %I:%M:%S %p %j %y %%").unwrap(),
            "Friday July 26, 2024 09:05:03 AM 208 24 %"
        );
        assert_eq!(
            format_utc(0, "%Y-%m-%d %a %H").unwrap(),
            "1970-01-01 Thu 00"
        );
        assert_eq!(format_utc(951_782_400, "%F").unwrap(), "2000-02-29");
        assert!(format_utc(t, "%Q").unwrap_err().contains("%Q"));
    }
}
