"""The search benchmark's data: realistic tools as plugin authors describe them, generated
distractors, and plain-language requests that never name their tool.

``TOOLS``: (name, description, {argument: description}). ``REQUESTS``: (request, the tool it
wants). ``distractors(n)``: ``n`` more tools from other domains, named and described the way
the realistic ones are.
"""

from __future__ import annotations

import random

TOOLS: list[tuple[str, str, dict[str, str]]] = [
    ("get-weather", "Current weather conditions for a city: temperature, wind, humidity and sky.",
     {"city": "City name, e.g. Paris", "units": "metric or imperial"}),
    ("weather-forecast", "Daily weather forecast for the next days: highs, lows and chance of rain.",
     {"city": "City name", "days": "How many days ahead, 1 to 10"}),
    ("convert-currency", "Convert an amount of money from one currency to another at today's exchange rate.",
     {"amount": "The amount to convert", "from_currency": "ISO code, e.g. EUR", "to_currency": "ISO code, e.g. USD"}),
    ("exchange-rate-history", "Historical exchange rates between two currencies over a date range.",
     {"base": "Base currency code", "quote": "Quote currency code", "start": "First date", "end": "Last date"}),
    ("create-calendar-event", "Create an event in the user's calendar with a title, start time, duration and guests.",
     {"title": "What the meeting is about", "start": "When it starts", "duration_minutes": "How long",
      "attendees": "Email addresses to invite"}),
    ("list-calendar-events", "List the events on the user's calendar between two dates.",
     {"start": "From this date", "end": "To this date"}),
    ("find-free-slot", "Find a free time slot when all the given people are available for a meeting.",
     {"attendees": "People who must attend", "duration_minutes": "Length of the meeting",
      "within_days": "Search window"}),
    ("send-email", "Send an email message to one or more recipients, with a subject and body.",
     {"to": "Recipient addresses", "subject": "Subject line", "body": "Message text"}),
    ("search-email", "Search the user's mailbox for messages by sender, subject words or date.",
     {"query": "Words to look for", "sender": "From this address", "since": "Received after this date"}),
    ("create-ticket", "Open a support ticket in the helpdesk with a summary, description and priority.",
     {"summary": "One-line problem summary", "description": "Details of the issue",
      "priority": "low, normal or urgent"}),
    ("update-ticket-status", "Change the status of an existing helpdesk ticket, e.g. to resolved or waiting.",
     {"ticket_id": "The ticket number", "status": "New status"}),
    ("list-open-tickets", "List the helpdesk tickets that are still open, newest first, optionally for one customer.",
     {"customer": "Customer account", "limit": "How many"}),
    ("translate-text", "Translate text from one language into another, for example English to Spanish.",
     {"text": "Text to translate", "target_language": "Language to translate into"}),
    ("detect-language", "Detect which language a piece of text is written in.",
     {"text": "The text"}),
    ("summarize-document", "Summarize a long document or article into a few key points.",
     {"text": "The document text", "max_sentences": "Length of the summary"}),
    ("spell-check", "Check spelling and grammar of a text and suggest corrections.",
     {"text": "Text to check"}),
    ("stock-quote", "Latest share price and daily change for a stock ticker symbol on the market.",
     {"symbol": "Ticker symbol, e.g. AAPL"}),
    ("crypto-price", "Current price of a cryptocurrency such as bitcoin or ether.",
     {"coin": "Coin name or symbol"}),
    ("calculate", "Evaluate an arithmetic expression and return its value.",
     {"expression": "The expression, e.g. 2 * (3 + 4)"}),
    ("unit-convert",
     "Convert a measurement between units: kilometres to miles, kilograms to pounds, celsius to fahrenheit.",
     {"value": "The number", "from_unit": "Unit it is in", "to_unit": "Unit wanted"}),
    ("timezone-convert", "Convert a time from one time zone to another.",
     {"time": "The time", "from_zone": "Its time zone", "to_zone": "Target time zone"}),
    ("world-clock", "The current local time in a city anywhere in the world.",
     {"city": "City name"}),
    ("geocode-address", "Turn a street address into latitude and longitude coordinates.",
     {"address": "Street address"}),
    ("driving-directions", "Step-by-step driving directions and travel time between two places.",
     {"origin": "Start", "destination": "End"}),
    ("nearby-restaurants", "Find restaurants near a location, filtered by cuisine and price.",
     {"location": "Where", "cuisine": "Kind of food", "max_price": "Price level 1-4"}),
    ("book-flight", "Search and book airline flights between two airports on a date.",
     {"from_airport": "Departure airport code", "to_airport": "Arrival airport code", "date": "Travel date"}),
    ("hotel-search", "Search hotels in a city for given check-in and check-out dates and guests.",
     {"city": "Destination", "check_in": "Arrival date", "check_out": "Departure date", "guests": "Number of guests"}),
    ("track-package", "Track a parcel shipment by its tracking number and show delivery status.",
     {"tracking_number": "Carrier tracking number"}),
    ("order-status", "Look up the status of a customer's online shop order by order number.",
     {"order_id": "Order number"}),
    ("refund-order", "Issue a refund for a customer order, in full or in part.",
     {"order_id": "Order number", "amount": "Amount to refund", "reason": "Why"}),
    ("inventory-level", "How many units of a product are in stock in each warehouse.",
     {"sku": "Product SKU"}),
    ("create-invoice", "Create an invoice for a customer with line items and a due date.",
     {"customer": "Billing customer", "items": "Line items with prices", "due_date": "Payment due"}),
    ("query-database", "Run a read-only SQL query against the analytics database and return rows.",
     {"sql": "The SELECT statement"}),
    ("run-python", "Execute a short Python code snippet in a sandbox and return its output.",
     {"code": "Python source"}),
    ("web-search", "Search the web and return the top result titles, links and snippets.",
     {"query": "Search terms"}),
    ("fetch-webpage", "Download a web page by URL and return its readable text.",
     {"url": "Page address"}),
    ("news-headlines", "Latest news headlines on a topic or from a country.",
     {"topic": "Subject", "country": "Country code"}),
    ("wikipedia-lookup", "Look up an encyclopedia article and return its introduction.",
     {"title": "Article title"}),
    ("define-word", "Dictionary definition, pronunciation and synonyms of an English word.",
     {"word": "The word"}),
    ("create-github-issue", "Open an issue in a GitHub repository with a title and body.",
     {"repository": "owner/name", "title": "Issue title", "body": "Issue text"}),
    ("list-pull-requests", "List open pull requests of a GitHub repository with their authors and review state.",
     {"repository": "owner/name"}),
    ("deploy-service", "Deploy a version of a service to the staging or production environment.",
     {"service": "Service name", "version": "Version or commit", "environment": "staging or production"}),
    ("server-metrics", "CPU, memory and disk usage of a server over the last hour.",
     {"host": "Server name"}),
    ("tell-joke", "Tell a joke on a given topic.",
     {"topic": "What the joke is about"}),
    ("recipe-search", "Find cooking recipes by ingredients or dish name, with steps and cooking time.",
     {"ingredients": "What you have", "diet": "vegetarian, vegan, ..."}),
    ("set-reminder", "Set a reminder that notifies the user at a given time with a message.",
     {"message": "What to remind", "when": "Date and time"}),
    ("create-note", "Save a note with a title and text to the user's notebook.",
     {"title": "Note title", "text": "Note body"}),
    ("image-caption", "Describe what is shown in an image at a URL.",
     {"image_url": "Address of the image"}),
]

#: Plain-language requests, none naming its tool, and the tool that answers each.
REQUESTS: list[tuple[str, str]] = [
    ("Is it going to rain in Lisbon this weekend?", "weather-forecast"),
    ("how hot is it in Madrid right now", "get-weather"),
    ("How many dollars do I get for 250 euros?", "convert-currency"),
    ("what was the yen to pound rate last March", "exchange-rate-history"),
    ("Put a meeting with Sam on my calendar tomorrow at 10", "create-calendar-event"),
    ("what's on my schedule next week", "list-calendar-events"),
    ("when can Ana, Bo and I all meet for an hour", "find-free-slot"),
    ("Mail the quarterly report summary to my boss", "send-email"),
    ("find the message Priya sent me about the contract", "search-email"),
    ("The printer on floor 3 is broken, please raise a support request", "create-ticket"),
    ("mark ticket 4411 as resolved", "update-ticket-status"),
    ("which support issues are still unresolved for Acme", "list-open-tickets"),
    ("Say 'good morning, how are you' in Spanish", "translate-text"),
    ("what language is this sentence written in", "detect-language"),
    ("Give me the key points of this long article", "summarize-document"),
    ("fix the typos and grammar in my paragraph", "spell-check"),
    ("How is Apple's share price doing today?", "stock-quote"),
    ("what is bitcoin worth", "crypto-price"),
    ("What's 17% of 2,340?", "calculate"),
    ("how many miles is 42 kilometres", "unit-convert"),
    ("If it's 9am in New York, what time is it in Tokyo?", "timezone-convert"),
    ("what time is it in Sydney now", "world-clock"),
    ("coordinates of 10 Downing Street", "geocode-address"),
    ("how do I drive from Lyon to Geneva", "driving-directions"),
    ("somewhere cheap to eat sushi near me", "nearby-restaurants"),
    ("I need a plane ticket from JFK to LAX on May 3rd", "book-flight"),
    ("a room in Rome for two people from the 4th to the 7th", "hotel-search"),
    ("where is my parcel 1Z999AA10123456784", "track-package"),
    ("has my shop purchase #5521 shipped yet", "order-status"),
    ("give the customer their money back for order 883", "refund-order"),
    ("how many of SKU-1138 are left in the warehouses", "inventory-level"),
    ("bill Globex for the March consulting work, due in 30 days", "create-invoice"),
    ("count the signups per day last month from our analytics tables", "query-database"),
    ("run this snippet and show me what it prints", "run-python"),
    ("what does the internet say about quantum batteries", "web-search"),
    ("read me the text of https://example.com/post", "fetch-webpage"),
    ("latest headlines about the elections in France", "news-headlines"),
    ("what does 'ephemeral' mean", "define-word"),
    ("file a bug in our repo about the login crash", "create-github-issue"),
    ("which code reviews are waiting in the api repository", "list-pull-requests"),
    ("ship version 2.3.1 of the billing service to production", "deploy-service"),
    ("is the db-01 machine running out of memory", "server-metrics"),
    ("make me laugh about cats", "tell-joke"),
    ("what can I cook with eggs, spinach and feta", "recipe-search"),
    ("remind me to call mum at 6pm", "set-reminder"),
    ("jot this idea down so I don't forget it", "create-note"),
    ("what is in this picture", "image-caption"),
]

_DOMAINS = ["inventory", "payroll", "fleet", "warehouse", "clinic", "school", "library", "farm", "factory",
            "laboratory", "museum", "stadium", "airport", "harbour", "bakery", "garage", "studio", "theatre",
            "pharmacy", "bank", "insurance", "energy", "telecom", "mining", "forestry", "fishery", "brewery",
            "vineyard", "orchestra", "gallery"]
_OBJECTS = ["record", "batch", "shift", "audit", "permit", "sensor", "contract", "asset", "schedule", "budget",
            "roster", "license", "inspection", "catalogue", "request", "policy", "claim", "job", "route", "lot"]
_VERBS = [("get", "Fetch"), ("list", "List every"), ("create", "Create a new"), ("update", "Update an existing"),
          ("delete", "Delete a"), ("archive", "Archive an old"), ("validate", "Validate a"), ("export", "Export a"),
          ("approve", "Approve a pending"), ("count", "Count the")]


def distractors(n: int, seed: int = 23) -> list[tuple[str, str, dict[str, str]]]:
    """``n`` tools from back-office domains (``<verb>-<domain>-<object>``, numbered once every
    combination is taken), described as the realistic ones are, with three arguments."""
    rng = random.Random(seed)
    made: dict[str, tuple[str, str, dict[str, str]]] = {}
    while len(made) < n:
        (verb, phrase), domain, thing = rng.choice(_VERBS), rng.choice(_DOMAINS), rng.choice(_OBJECTS)
        name = f"{verb}-{domain}-{thing}"
        if name in made:  # 6,000 combinations: number the rest
            name = f"{name}-{len(made)}"
        description = (f"{phrase} {thing} in the {domain} management system, by {rng.choice(_OBJECTS)} "
                       f"and {rng.choice(['date', 'owner', 'site', 'region', 'status'])}.")
        made[name] = (name, description, {f"{thing}_id": f"The {thing} identifier",
                                          "site": f"Which {domain} site", "note": "Optional comment"})
    return list(made.values())
