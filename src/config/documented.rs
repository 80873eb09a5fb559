//! `docs/configuration.md` lists every setting: a key added to [`super::keys::KEYS`] without a
//! row in the doc fails here. Each key must appear, in backticks, on one line together with its
//! environment variable (the settings table's row). The doc may list more than the code has.
//! Its "Reloading" section names exactly the keys only a restart changes.

#[cfg(test)]
mod tests {
    use super::super::RESTART_ONLY;
    use super::super::env::var_name;
    use super::super::keys::KEYS;

    const DOC: &str = include_str!("../../docs/configuration.md");

    #[test]
    fn every_key_is_in_the_configuration_doc() {
        let missing: Vec<String> = KEYS
            .iter()
            .filter_map(|k| {
                let key = format!("`{}`", k.name);
                let var = format!("`{}`", var_name(k.name));
                let row = DOC
                    .lines()
                    .any(|line| line.contains(&key) && line.contains(&var));
                (!row).then(|| format!("{key} with {var}"))
            })
            .collect();
        assert!(
            missing.is_empty(),
            "docs/configuration.md has no row naming {}",
            missing.join(", ")
        );
    }

    #[test]
    fn the_reloading_section_names_the_restart_only_keys() {
        let section = DOC
            .split("## Reloading")
            .nth(1)
            .and_then(|rest| rest.split("What only a restart changes").nth(1))
            .and_then(|rest| rest.split("###").next())
            .expect("docs/configuration.md has a Reloading section naming the restart-only keys");
        let named: Vec<&str> = KEYS
            .iter()
            .map(|k| k.name)
            .filter(|name| section.contains(&format!("`{name}`")))
            .collect();
        assert_eq!(named, RESTART_ONLY, "the doc's list of restart-only keys");
    }
}
