Z
storiesrÃb