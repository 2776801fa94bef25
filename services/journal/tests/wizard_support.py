"""Walking the console's six-step trigger wizard in a real browser: one helper for every wizard test.

A step is a mapping of field labels (exact) to what goes in: a ``str`` is typed into the field (``fill``), a
:class:`Choose` picks a drop-down's option, a ``bool`` sets a checkbox. Fields are looked up in the step on
screen only, so a label on the wrong step fails loudly instead of filling a hidden field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from playwright.async_api import BrowserContext, Locator, Page, expect

WIZARD_MS = 20_000
#: The six steps' titles, as the step indicator and the steps' headings say them (UI-2), then the review.
STEPS = (
    "Where the event comes from",
    "Which event",
    "Which agent",
    "Which data",
    "Who may be asked",
    "When nobody answers",
)
REVIEW = len(STEPS) + 1


class Choose(str):
    """A drop-down's option (its value), for :func:`fill_step`."""


Step = Mapping[str, "str | bool | Choose"]


def on_screen(page: Page) -> Locator:
    """The wizard's step (or review) on screen."""
    return page.locator("#trigger-form .wizard-step:not([hidden])")


async def expect_step(page: Page, number: int) -> None:
    """The indicator says step ``number`` (1-6; :data:`REVIEW` for the review) is the current one, and it shows."""
    current = page.locator('#trigger-form nav.steps button[aria-current="step"]')
    await expect(current).to_have_attribute("data-step", str(number), timeout=WIZARD_MS)
    title = STEPS[number - 1] if number < REVIEW else "Review and save"
    await expect(on_screen(page).get_by_role("heading", level=2)).to_contain_text(title)


async def fill_step(page: Page, fields: Step) -> None:
    step = on_screen(page)
    for label, value in fields.items():
        control = step.get_by_label(label, exact=True)
        if isinstance(value, Choose):
            await control.select_option(str(value))
        elif isinstance(value, bool):
            await control.set_checked(value)
        else:
            await control.fill(value)


async def next_step(page: Page, expected: int) -> None:
    """Press Next and wait for step ``expected`` (the step's check passed)."""
    await page.locator("#wizard-next").click()
    await expect_step(page, expected)


async def walk_wizard(page: Page, steps: Sequence[Step], first: int = 1) -> None:
    """From step ``first`` (on screen), fill each of ``steps`` and go on with Next: ends on the step after the
    last one given (the review after step 6)."""
    for offset, fields in enumerate(steps):
        await expect_step(page, first + offset)
        await fill_step(page, fields)
        await next_step(page, first + offset + 1)


async def go_to_step(page: Page, number: int) -> None:
    """Through the step indicator (back, or forward to a step already reached)."""
    await page.locator(f'#trigger-form nav.steps button[data-step="{number}"]').click()
    await expect_step(page, number)


async def save(page: Page, trigger_id: str, button: str = "Create trigger") -> None:
    """Save from the review and wait for the list saying so, as a success (a status, not an alert): "Trigger <id>
    created." for a new one, "Trigger <id> saved: now revision <n>." for an edit."""
    await expect_step(page, REVIEW)
    await page.get_by_role("button", name=button).click()
    said = (
        f"Trigger {trigger_id} created." if button == "Create trigger" else f"Trigger {trigger_id} saved: now revision"
    )
    await expect(page.locator("#message")).to_contain_text(said, timeout=WIZARD_MS)
    await expect(page.locator("#message")).to_have_attribute("data-kind", "success")
    await expect(page.locator("#message")).to_have_attribute("role", "status")


async def open_wizard(context: BrowserContext, url: str, token: str, hash_: str = "#/wizard") -> Page:
    """A new page at the console's ``hash_`` (the wizard), signed in with the API ``token`` (typed, then Enter)."""
    page = await context.new_page()
    await page.goto(f"{url}/console/{hash_}")
    await page.get_by_label("API token").fill(token)
    await page.keyboard.press("Enter")
    await expect(page.locator("#who")).not_to_have_text("", timeout=WIZARD_MS)
    return page
